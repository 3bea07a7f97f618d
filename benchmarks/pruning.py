"""Benchmark AcceRL's ``lm_head`` pruning: head size, optimizer state, step memory and step time.

Run::

    python -m benchmarks.pruning [--hidden-size 512 --layers 2 --vocab 32000 --n-bins 256
        --batch 8 --seq 64 --action-tokens 7 --steps 20 --out benchmarks/results]
    python -m benchmarks.pruning --device cuda --dtype bf16      # on a GPU

One random Llama (``vocab`` x ``hidden-size``, ``layers`` layers) is deep-copied; the copy gets
its ``lm_head`` pruned to the last ``n-bins`` rows (:func:`fastlight.vla.pruning.prune_lm_head`).
Both start from the same weights and train side by side in one process on the same batches:
one training step = forward + cross-entropy of the ``action-tokens`` last positions over the
action bins (the full head's logits are sliced to the same rows, so both optimise the same
loss) + backward + Adam step. Step times are interleaved (A, B, then B, A, ...) and the
median is reported. Two logits settings are measured: ``all`` (the HF default: logits at every
position, as a plain ``model(...).logits`` gives) and ``action`` (``logits_to_keep=K``: logits
only at the action positions, the cheapest an unpruned model can do).

Memory (AcceRL claims VRAM savings):
- persistent = parameters + Adam state (``exp_avg``, ``exp_avg_sq``, ``step``), counted from tensors;
- transient = the peak of (bytes allocated - bytes freed) during one training step (gradients,
  activations, logits, temporaries). On CPU it comes from the PyTorch profiler's allocation
  events (``profile_memory=True``; the CPU allocator reports every alloc/free; ``tracemalloc``
  cannot see tensor memory); on CUDA from ``torch.cuda.max_memory_allocated()`` minus the
  allocation at the start of the step;
- peak step memory = persistent + transient.

Results go to ``<out>/pruning.md`` (table and the exact command) and ``<out>/pruning.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from fastlight.vla.policy import build_llama
from fastlight.vla.pruning import prune_lm_head

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LOGITS_MODES = ("all", "action", "both")
SETUP_KEYS = (
    "vocab", "hidden_size", "layers", "intermediate_size", "batch", "seq", "action_tokens", "n_bins", "steps",
    "warmup", "device", "dtype",
)  # fmt: skip


@dataclass
class Variant:
    """One model under test: its optimizer and how it computes logits."""

    name: str
    model: nn.Module
    opt: torch.optim.Optimizer
    pruned: bool
    logits_to_keep: int
    first_id: int
    times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line settings; see the module docstring."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.pruning", description=__doc__.split("\n")[0])
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--intermediate-size", type=int, default=1376)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--n-bins", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--action-tokens", type=int, default=7)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--logits", choices=LOGITS_MODES, default="both")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    if not 1 <= args.action_tokens < args.seq:
        p.error(f"--action-tokens must be in [1, --seq={args.seq}), got {args.action_tokens}")
    if not 2 <= args.n_bins <= args.vocab:
        p.error(f"--n-bins must be in [2, --vocab={args.vocab}], got {args.n_bins}")
    if args.steps < 1 or args.warmup < 0:
        p.error(f"--steps must be >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    return args


def build_variants(args: argparse.Namespace) -> list[Variant]:
    """The baseline Llama and its pruned deep copy, for each requested logits setting."""
    torch.manual_seed(args.seed)
    dtype, first = DTYPES[args.dtype], args.vocab - args.n_bins
    base = build_llama(args.vocab, args.hidden_size, args.layers, args.heads, args.intermediate_size)
    base = base.to(device=args.device, dtype=dtype).train()
    modes = ["all", "action"] if args.logits == "both" else [args.logits]
    variants = []
    for mode in modes:
        keep = 0 if mode == "all" else args.action_tokens
        for pruned in (False, True):
            model = copy.deepcopy(base)
            if pruned:
                prune_lm_head(model, first, args.vocab)
            opt = torch.optim.Adam(model.parameters(), lr=args.lr)
            name = f"{'pruned' if pruned else 'full'} head, logits={mode}"
            variants.append(Variant(name, model, opt, pruned, keep, first))
    del base
    return variants


def make_batch(args: argparse.Namespace, step: int) -> tuple[Tensor, Tensor]:
    """Token ids ``[B, S]`` (text ids, then ``K`` action ids) and target bins ``[B, K]``."""
    g = torch.Generator().manual_seed(args.seed * 100_003 + step)
    first, k = args.vocab - args.n_bins, args.action_tokens
    text = torch.randint(0, first, (args.batch, args.seq - k), generator=g)
    bins = torch.randint(0, args.n_bins, (args.batch, k), generator=g)
    ids = torch.cat([text, bins + first], dim=1)
    return ids.to(args.device), bins.to(args.device)


def train_step(v: Variant, ids: Tensor, bins: Tensor) -> Tensor:
    """Forward, cross-entropy on the last ``K`` positions over the action bins, backward, Adam step."""
    k = bins.shape[1]
    logits = v.model(input_ids=ids, logits_to_keep=v.logits_to_keep).logits[:, -k:]  # [B, K, V or N]
    if not v.pruned:
        logits = logits[..., v.first_id :]
    loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), bins.reshape(-1))
    loss.backward()
    v.opt.step()
    v.opt.zero_grad(set_to_none=True)
    return loss.detach()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_interleaved(variants: list[Variant], args: argparse.Namespace) -> None:
    """Warm up, then time ``steps`` steps of every variant, rotating their order each step."""
    for i in range(args.warmup + args.steps):
        ids, bins = make_batch(args, i)
        shift = i % len(variants)
        for v in variants[shift:] + variants[:shift]:
            _sync(args.device)
            t0 = time.perf_counter()
            loss = train_step(v, ids, bins)
            _sync(args.device)
            if i >= args.warmup:
                v.times.append(time.perf_counter() - t0)
                v.losses.append(float(loss))


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, Tensor))


def _cpu_transient_peak(v: Variant, ids: Tensor, bins: Tensor) -> int:
    """Peak net bytes allocated during one CPU step, from the profiler's allocation events."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train_step(v, ids, bins)
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation and str(node.typed[1].device).startswith("cpu"):
            events.append((node.start_time_ns, node.typed[1].alloc_size))
        stack.extend(node.children)
    running = peak = 0
    for _, size in sorted(events):
        running += size
        peak = max(peak, running)
    return peak


def measure_memory(v: Variant, args: argparse.Namespace) -> dict[str, int]:
    """Parameter, Adam-state and training-step memory of one variant (bytes; see module docstring)."""
    ids, bins = make_batch(args, 10_000)
    params = _nbytes(v.model.parameters())
    adam = _nbytes(t for state in v.opt.state.values() for t in state.values())
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        train_step(v, ids, bins)
        torch.cuda.synchronize()
        transient = torch.cuda.max_memory_allocated() - start
    else:
        transient = _cpu_transient_peak(v, ids, bins)
    return {"param_bytes": params, "adam_state_bytes": adam, "transient_peak_bytes": transient,
            "peak_step_bytes": params + adam + transient}  # fmt: skip


def summarise(v: Variant, args: argparse.Namespace) -> dict:
    """Counts, memory and timing of one variant (after :func:`time_interleaved`)."""
    head = v.model.get_output_embeddings()
    out = {
        "name": v.name,
        "pruned": v.pruned,
        "logits_to_keep": v.logits_to_keep,
        "head_params": sum(p.numel() for p in head.parameters()),
        "total_params": sum(p.numel() for p in v.model.parameters()),
        "median_step_s": statistics.median(v.times),
        "min_step_s": min(v.times),
        "step_times_s": v.times,
        "losses": v.losses,
    }
    out.update(measure_memory(v, args))
    return out


def compare(rows: list[dict]) -> list[dict]:
    """Full-vs-pruned ratios for each logits setting (rows come in (full, pruned) pairs)."""
    pairs = []
    for full, pruned in zip(rows[::2], rows[1::2], strict=True):
        pairs.append({
            "logits": "all" if full["logits_to_keep"] == 0 else "action",
            "head_param_ratio": full["head_params"] / pruned["head_params"],
            "total_param_ratio": full["total_params"] / pruned["total_params"],
            "adam_state_ratio": full["adam_state_bytes"] / pruned["adam_state_bytes"],
            "peak_step_memory_ratio": full["peak_step_bytes"] / pruned["peak_step_bytes"],
            "median_step_speedup": full["median_step_s"] / pruned["median_step_s"],
            "max_abs_loss_diff": max(
                abs(a - b) for a, b in zip(full["losses"], pruned["losses"], strict=True)
            ),
        })  # fmt: skip
    return pairs


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def render_markdown(rows: list[dict], pairs: list[dict], meta: dict) -> str:
    """The ``pruning.md`` report: setup, exact command, per-variant table and ratios."""
    lines = [
        "# lm_head pruning (AcceRL): full vs pruned head, side by side",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Setup: Llama vocab={meta['vocab']}, hidden={meta['hidden_size']}, layers={meta['layers']}, "
        f"intermediate={meta['intermediate_size']}; batch={meta['batch']} x seq={meta['seq']}, "
        f"K={meta['action_tokens']} action tokens, {meta['n_bins']} bins; {meta['steps']} timed steps "
        f"after {meta['warmup']} warm-up, interleaved; device={meta['device']} ({meta['device_name']}), "
        f"dtype={meta['dtype']}, torch {meta['torch']}, {meta['threads']} threads.",
        "",
        "Train step = forward + cross-entropy over the action bins at the K action positions + "
        "backward + Adam step. Memory: persistent (params + Adam state) + transient peak of one step "
        f"({meta['memory_method']}).",
        "",
        "| variant | head params | total params | Adam state MiB | peak step MiB | median step ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['head_params']:,} | {r['total_params']:,} | {_mib(r['adam_state_bytes'])} "
            f"| {_mib(r['peak_step_bytes'])} | {1000 * r['median_step_s']:.1f} |"
        )
    lines += ["", "| logits | head params ÷ | total params ÷ | Adam state ÷ | peak step memory ÷ | "
              "step speed-up × | max abs loss diff |", "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for p in pairs:
        lines.append(
            f"| {p['logits']} | {p['head_param_ratio']:.1f} | {p['total_param_ratio']:.2f} "
            f"| {p['adam_state_ratio']:.2f} | {p['peak_step_memory_ratio']:.2f} "
            f"| {p['median_step_speedup']:.2f} | {p['max_abs_loss_diff']:.2e} |"
        )
    lines += [
        "",
        "Both heads start from the same weights and see the same batches; the loss difference "
        "checks that pruning does not change the optimisation (only rounding differs).",
        "",
    ]
    return "\n".join(lines)


def _meta(args: argparse.Namespace, argv: list[str] | None) -> dict:
    cuda = args.device.startswith("cuda")
    cmd_args = sys.argv[1:] if argv is None else argv
    return {
        **{k: getattr(args, k) for k in SETUP_KEYS},
        "command": " ".join(["python -m benchmarks.pruning", *map(shlex.quote, cmd_args)]),
        "device_name": torch.cuda.get_device_name(args.device) if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "memory_method": "torch.cuda.max_memory_allocated" if cuda else "torch.profiler allocation events",
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print the Markdown table and write ``pruning.md`` / ``pruning.json``."""
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device} requested but CUDA is not available")
    variants = build_variants(args)
    time_interleaved(variants, args)
    rows = [summarise(v, args) for v in variants]
    pairs = compare(rows)
    meta = _meta(args, argv)
    report = render_markdown(rows, pairs, meta)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pruning.md").write_text(report)
    result = {"meta": meta, "variants": rows, "comparison": pairs}
    (out / "pruning.json").write_text(json.dumps(result, indent=2))
    print(report)
    return result


if __name__ == "__main__":
    main()
