"""``python -m benchmarks.sync.lora``: bytes and time per weight sync with and without LoRA.

Since a sync publishes trainable tensors only (:func:`fastlight.weights.buckets.sync_entries`), a LoRA
run sends its adapters, the pruned ``lm_head`` and the policy's small modules (patch encoder, proprio
projection, action queries, value head) instead of the whole backbone. Two ``VLAPolicy`` with the
same random Llama (built from a config: ``--hidden`` x ``--layers``, ``--vocab``), one fully
trainable and one with ``lora={r, alpha, target_modules: all projections}``, are synced through
both CPU paths a training run uses:

- ``shared_memory`` (samplers holding policy copies): :class:`~fastlight.weights.shared_memory.SharedWeights`,
  timed from the trainer's ``publish`` to the end of one sampler copy's ``load_into`` (one process);
- ``double_buffer`` (the CPU inference worker): :class:`~fastlight.weights.double_buffer.SharedDoubleBuffer`,
  timed from ``publish`` until a spawned worker, serving in the production loop
  (:func:`~fastlight.inference.server.serve_until`), has swapped to the new slot and acked.

Syncs alternate between the two policies (ABBA) so that load drifts hit both alike; medians over
``--reps``. After the last sync each copy's weights are compared with the trainer's (all tensors,
frozen ones included: they came with the copy). Appends a section to ``<out>/sync.md`` with the
command, the table and what was measured.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from fastlight.data.cpu_copy import cpu_copy
from fastlight.inference.server import serve_until
from fastlight.vla.lora import DEFAULT_TARGETS
from fastlight.vla.policy import VLAPolicy
from fastlight.weights.buckets import sync_entries
from fastlight.weights.double_buffer import SharedDoubleBuffer
from fastlight.weights.shared_memory import SharedWeights

SETTINGS = ("full", "lora")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sync.lora", description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=256, help="Llama hidden size (intermediate: 4x)")
    p.add_argument("--layers", type=int, default=4, help="Llama layers")
    p.add_argument("--vocab", type=int, default=32000, help="Llama vocabulary (the head keeps 256 rows)")
    p.add_argument("--rank", type=int, default=16, help="LoRA r (alpha = 2 r)")
    p.add_argument("--reps", type=int, default=20, help="timed syncs per path and setting (+1 warm-up)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder of sync.md")
    args = p.parse_args(argv)
    if min(args.hidden, args.layers, args.rank, args.reps) < 1 or args.hidden % 4:
        raise SystemExit("--hidden (a multiple of 4), --layers, --rank and --reps must be >= 1")
    return args


def make_policy(args: argparse.Namespace, lora: bool) -> VLAPolicy:
    torch.manual_seed(0)  # the same backbone and modules in both settings
    settings = {"r": args.rank, "alpha": 2 * args.rank, "target_modules": list(DEFAULT_TARGETS)}
    return VLAPolicy(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                     num_attention_heads=4, intermediate_size=4 * args.hidden, proprio_dim=39,
                     lora=settings if lora else None)  # fmt: skip


def _perturb(policy: torch.nn.Module, version: int) -> None:
    """An update: every trainable tensor moves (the frozen base weights never do)."""
    with torch.no_grad():
        for t in policy.parameters():
            if t.requires_grad:
                t.add_(1e-3 * ((version % 7) + 1))


def _worker(policy: torch.nn.Module, shared: SharedDoubleBuffer, stop: Any, done: Any) -> None:
    """The inference worker's loop, serving nothing: between two (empty) forwards it takes new weights."""
    torch.set_num_threads(1)
    reader = shared.attach(policy, name="bench inference worker", stopped=stop.is_set)
    idle = lambda: time.sleep(1e-4)  # noqa: E731 -- no requests: only syncs
    serve_until(reader, policy, stopped=stop.is_set, serve_once=idle, on_sync=lambda v: None)
    done.put(_digest(policy))


def _digest(policy: torch.nn.Module) -> list[float]:
    """Per-tensor float64 sums of the full state dict (frozen tensors included), in order."""
    return [float(v.detach().double().sum()) for v in policy.state_dict().values() if v.is_floating_point()]


class Setting:
    """One policy (full or LoRA): its trainer copy, a sampler copy and a spawned inference worker."""

    def __init__(self, args: argparse.Namespace, name: str, ctx: Any) -> None:
        self.name = name
        self.policy = make_policy(args, lora=name == "lora")
        self.sampler = cpu_copy(self.policy).eval()  # what the pool gives its samplers at start
        self.shared = SharedWeights(self.sampler, ctx)
        self.double = SharedDoubleBuffer(self.policy, ctx, timeout_s=120, worker_name="bench worker")
        self.stop, self.done = ctx.Event(), ctx.Queue()
        self.proc = ctx.Process(target=_worker, args=(cpu_copy(self.policy).eval(), self.double, self.stop,
                                                      self.done), daemon=True)  # fmt: skip
        self.proc.start()
        entries = sync_entries(self.policy)
        self.tensors = len(entries)
        self.floats = sum(t.numel() for _, t in entries)
        self.params = sum(t.numel() for t in self.policy.parameters())
        self.times: dict[str, list[float]] = {"shared_memory": [], "double_buffer": []}
        self.bytes: dict[str, int] = {}
        self.sampler_exact = False

    def sync(self, path: str, version: int, keep: bool) -> None:
        _perturb(self.policy, version)
        t0 = time.perf_counter()
        if path == "shared_memory":
            stats = self.shared.publish(self.policy, version)
            self.shared.load_into(self.sampler)
            ms = 1000.0 * (time.perf_counter() - t0)
            self.sampler_exact = _digest(self.sampler) == _digest(self.policy)  # the latest sync's
        else:
            stats = self.double.publish(self.policy, version, check=self._alive)
            ms = 1000.0 * (time.perf_counter() - t0)
        self.bytes[path] = stats.bytes
        if keep:
            self.times[path].append(ms)

    def _alive(self) -> None:
        if not self.proc.is_alive():
            raise RuntimeError(f"bench inference worker ({self.name}) died, exit code {self.proc.exitcode}")

    def close(self) -> dict[str, bool]:
        """Stop the worker; whether the sampler copy and the worker hold the trainer's weights exactly."""
        self.stop.set()
        worker = self.done.get(timeout=60)
        self.proc.join(timeout=10)
        return {"shared_memory": self.sampler_exact, "double_buffer": worker == _digest(self.policy)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    settings = {name: Setting(args, name, ctx) for name in SETTINGS}
    version = 0
    try:
        for rep in range(args.reps + 1):  # rep 0 warms up (first-touch pages, the worker's start)
            order = SETTINGS if rep % 2 == 0 else SETTINGS[::-1]  # ABBA
            for path in ("shared_memory", "double_buffer"):
                for name in order:
                    version += 1
                    settings[name].sync(path, version, keep=rep > 0)
        exact = {name: s.close() for name, s in settings.items()}
    finally:
        for s in settings.values():
            if s.proc.is_alive():
                s.proc.kill()
    rows = []
    for name, s in settings.items():
        for path, times in s.times.items():
            rows.append({"setting": name, "path": path, "params": s.params, "tensors": s.tensors,
                         "floats": s.floats, "bytes": s.bytes[path], "median_ms": statistics.median(times),
                         "p90_ms": statistics.quantiles(times, n=10)[-1] if len(times) > 1 else times[0],
                         "exact": exact[name][path]})  # fmt: skip
    return {"rows": rows}


def render(args: argparse.Namespace, argv: Sequence[str], result: dict[str, Any], wall_s: float) -> str:
    command = "python -m benchmarks.sync.lora" + ("" if not argv else " " + shlex.join(argv))
    rows = {(r["setting"], r["path"]): r for r in result["rows"]}
    p = rows[("full", "shared_memory")]["params"]
    lines = [
        f"## LoRA: bytes and time per sync ({datetime.date.today().isoformat()})",
        "",
        f"Command: `{command}`",
        "",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs ({platform.machine()}), one process per path end; "
        f"`VLAPolicy` over a random Llama (hidden {args.hidden}, {args.layers} layers, intermediate "
        f"{4 * args.hidden}, vocab {args.vocab}, head pruned to 256 bins), {p / 1e6:.1f}M parameters; LoRA "
        f"r {args.rank}, alpha {2 * args.rank}, on {', '.join(DEFAULT_TARGETS)}; {args.reps} timed syncs per "
        f"path and setting (+1 warm-up), alternating ABBA; wall {wall_s:.0f} s.",
        "",
        "| path | setting | tensors sent | MiB per sync (`sync/bytes`) | time per sync: median / p90 | "
        "weights exact |",
        "|---|---|---|---|---|---|",
    ]
    for path in ("shared_memory", "double_buffer"):
        for name in SETTINGS:
            r = rows[(name, path)]
            exact = "yes" if r["exact"] else "NO"
            lines.append(f"| {path} | {name} | {r['tensors']} | {r['bytes'] / 2**20:.2f} | "
                         f"{r['median_ms']:.2f} / {r['p90_ms']:.2f} ms | {exact} |")  # fmt: skip
    lines.append("")
    for path in ("shared_memory", "double_buffer"):
        full, lora = rows[("full", path)], rows[("lora", path)]
        lines.append(f"- {path}: LoRA sends {full['bytes'] / lora['bytes']:.1f}x fewer bytes and syncs "
                     f"{full['median_ms'] / lora['median_ms']:.1f}x faster (medians).")  # fmt: skip
    lines += [
        "",
        "What was measured: `shared_memory` = the trainer's `SharedWeights.publish` (copy into the float32 "
        "shared buffer) + one sampler copy's `load_into`, in one process; `double_buffer` = "
        "`SharedDoubleBuffer.publish` until a spawned CPU inference worker, in `serve_until`, has pointed "
        "its tensors at the new slot and acked. Both send what `sync_entries` selects: trainable "
        "parameters and floating buffers; the LoRA policy's frozen base weights reached the copies once, "
        'when they were made. "weights exact": after the last sync every floating tensor of the copy '
        "(frozen ones included) sums to the trainer's, tensor by tensor.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    result = run(args)
    section = render(args, argv, result, time.perf_counter() - t0)
    args.out.mkdir(parents=True, exist_ok=True)
    md = args.out / "sync.md"
    before = md.read_text() if md.exists() else "# Weight sync\n\n"
    md.write_text(before.rstrip("\n") + "\n\n\n" + section)
    print(section, flush=True)
    return result


if __name__ == "__main__":
    main()
