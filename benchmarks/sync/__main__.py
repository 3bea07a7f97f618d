"""``python -m benchmarks.sync``: trainer -> inference-worker weight sync, side by side
(AcceRL §NCCL weight synchronization, §Inference Drain).

One trainer process (this one) and one spawned inference-worker process hold the same model (a
stack of ``nn.Linear``, fp32 on CPU / bf16 on CUDA). Per model size, each repetition runs every
method once, interleaved so machine-load drifts hit all of them alike, and times it from the
trainer's first action until the worker acks that the new weights are loaded in place:

- ``bucketed``: :meth:`WeightBroadcaster.broadcast` -- flat per-dtype buckets, one collective each;
- ``per_tensor``: :data:`benchmarks.sync.per_tensor.PER_TENSOR` transport -- one collective per tensor;
- ``pickle``: host-staged -- ``state_dict`` -> ``pickle.dumps`` -> ``multiprocessing`` queue ->
  ``pickle.loads`` -> ``load_state_dict``;
- ``checkpoint``: ``torch.save`` to a file, the worker ``torch.load`` + ``load_state_dict`` (AReaL
  style); ``checkpoint_fsync`` is the same with ``fsync`` before the worker is told (a durable
  write, closer to a shared file system than a write that stays in the page cache);
- ``shared_memory`` (CPU worker only): :class:`~fastlight.weights.double_buffer.SharedDoubleBuffer`
  -- the trainer copies once into the free shared slot and flips; the worker swaps its tensors to
  views of that slot (no copy) and acks;
- ``memcpy``: the reference, not a sync -- one ``Tensor.copy_`` of the same number of bytes
  between two flat tensors in the trainer process, timed in the same repetitions.

Drain: the worker serves a steady load (forward batches of ``--forward-ms``) while the trainer
runs emulated updates and syncs after each. With drain the signal goes ``--drain-lead-ms``
before the update ends (the worker finishes its in-flight batch and waits in the broadcast);
without, it goes at the update end (the trainer also waits for the in-flight batch's tail). The
trainer's wait is update end -> broadcast returned (worker acked), transfer included.

Writes ``sync.md`` (tables, the exact command, what was modelled, targets) and ``sync.json``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from benchmarks.checksums import weights_checksum
from benchmarks.sync.per_tensor import PER_TENSOR
from benchmarks.sync.report import write_outputs
from benchmarks.sync.worker import WorkerSpec, make_model, model_shape, parse_size, worker_main
from fastlight.weights.broadcast import SyncGroupConfig, WeightBroadcaster, choose_backend
from fastlight.weights.double_buffer import SharedDoubleBuffer

METHODS = ("bucketed", "per_tensor", "pickle", "checkpoint", "checkpoint_fsync", "shared_memory", "memcpy")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sync", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["10M", "100M"],
                   help="parameter counts, e.g. 10M 100M 1B; SIZE:WIDTH forces Linear(WIDTH, WIDTH) layers")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu: fp32 over gloo; cuda: bf16")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per method (after one warm-up)")
    p.add_argument("--bucket-mb", type=float, default=64.0)
    p.add_argument("--drain-sizes", nargs="*", default=["1M", "10M"],
                   help="model sizes of the drain experiment (none: skip it)")
    p.add_argument("--forward-ms", type=float, nargs="+", default=[50.0, 150.0],
                   help="emulated forward batch time(s) of the serving worker")
    p.add_argument("--drain-lead-ms", type=float, default=None,
                   help="drain signal lead before the update ends (default: forward ms + 10)")
    p.add_argument("--update-ms", type=float, default=300.0, help="emulated update time (plus U(0, forward))")
    p.add_argument("--drain-reps", type=int, default=20, help="syncs per drain mode")
    p.add_argument("--batch", type=int, default=8, help="rows per worker forward batch")
    p.add_argument("--timeout-s", type=float, default=120.0, help="sync group collective timeout")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", type=Path, default=None, help="where checkpoints go (default: a temp dir)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
    if args.reps < 1 or args.drain_reps < 1 or args.bucket_mb <= 0:
        raise SystemExit("--reps and --drain-reps must be >= 1, --bucket-mb > 0")
    if max(lead_ms(args, f) for f in args.forward_ms) >= args.update_ms:
        raise SystemExit(f"the drain lead ({args.drain_lead_ms or 'forward ms + 10'}) must be < --update-ms "
                         f"({args.update_ms})")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible")
    if args.device == "cuda" and "shared_memory" in args.methods:
        print("note: shared_memory is the CPU worker's path; skipped with --device cuda", flush=True)
        args.methods = [m for m in args.methods if m != "shared_memory"]
    return args


def lead_ms(args: argparse.Namespace, forward_ms: float) -> float:
    return args.drain_lead_ms if args.drain_lead_ms is not None else forward_ms + 10.0


def placement(device: str) -> tuple[str, str, str, str]:
    """(trainer device, worker device, dtype, backend). One GPU: both on it over gloo (NCCL refuses
    two ranks on one GPU; CUDA IPC would be the same-GPU path)."""
    if device == "cpu":
        return "cpu", "cpu", "float32", "gloo"
    worker = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
    return "cuda:0", worker, "bfloat16", choose_backend("cuda:0", worker) if worker != "cuda:0" else "gloo"


class Worker:
    """The spawned inference worker and its command pipe / pickle queue."""

    def __init__(self, spec: WorkerSpec, timeout_s: float, shared: SharedDoubleBuffer | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.queue = ctx.Queue()
        self.timeout_s = timeout_s
        self.proc = ctx.Process(target=worker_main, args=(spec, child, self.queue, shared), daemon=True,
                                name="bench-sync-worker")
        self.proc.start()

    def send(self, msg: tuple) -> None:
        self.conn.send(msg)

    def check(self) -> None:
        if not self.proc.is_alive():
            raise RuntimeError(f"bench sync worker (pid {self.proc.pid}) died, exit code "
                               f"{self.proc.exitcode}")

    def recv(self) -> Any:
        deadline = time.monotonic() + self.timeout_s
        while not self.conn.poll(0.05):
            if not self.proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"bench sync worker (pid {self.proc.pid}) died or timed out, "
                                   f"exit code {self.proc.exitcode}")
        status, value = self.conn.recv()
        if status == "error":
            raise RuntimeError(f"bench sync worker (pid {self.proc.pid}) failed:\n{value}")
        return value

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.send(("quit",))
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def _perturb(model: torch.nn.Module, version: int) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * ((version % 7) + 1))


class Extras:
    """What the two newer methods need: the shared double buffer and the memcpy reference's tensors."""

    def __init__(self, shared: SharedDoubleBuffer | None, nbytes: int, dtype: torch.dtype,
                 device: str) -> None:
        self.shared = shared
        n = nbytes // torch.empty((), dtype=dtype).element_size()
        self.src = torch.randn(n, device=device).to(dtype)
        self.dst = torch.zeros_like(self.src)  # both touched here, not in a timed copy


def _sync_once(method: str, bc: WeightBroadcaster, worker: Worker, version: int, ckpt: Path,
               extras: Extras) -> float:
    """One timed sync: trainer's first action -> worker's ack that the weights are in place (ms)."""
    model = bc.module
    t0 = time.perf_counter()
    if method == "memcpy":  # the reference: one copy of the same bytes, no worker involved
        extras.dst.copy_(extras.src)
        if extras.dst.is_cuda:
            torch.cuda.synchronize(extras.dst.device)
        return (time.perf_counter() - t0) * 1e3
    if method == "shared_memory":
        assert extras.shared is not None
        worker.send(("shared_memory", version))
        extras.shared.publish(model, version, check=worker.check)
    elif method in ("bucketed", "per_tensor"):
        worker.send((method, version))
        bc.broadcast(version) if method == "bucketed" else bc.broadcast(version, transport=PER_TENSOR)
    elif method == "pickle":
        worker.send(("pickle", version))
        payload = pickle.dumps({k: v.detach().cpu() for k, v in model.state_dict().items()}, protocol=5)
        worker.queue.put(payload)
    else:
        with open(ckpt, "wb") as f:
            torch.save(model.state_dict(), f)
            if method == "checkpoint_fsync":
                f.flush()
                os.fsync(f.fileno())
        worker.send(("checkpoint", version, str(ckpt)))
    got = worker.recv()
    elapsed = (time.perf_counter() - t0) * 1e3
    if got != version:
        raise RuntimeError(f"{method}: worker acked {got}, expected {version}")
    return elapsed


def bench_latency(args: argparse.Namespace, bc: WeightBroadcaster, worker: Worker, ckpt: Path,
                  extras: Extras) -> dict:
    times: dict[str, list[float]] = {m: [] for m in args.methods}
    verified: dict[str, bool] = {}
    version = 0
    for rep in range(args.reps + 1):  # rep 0 warms up (first-touch pages, connections)
        for method in args.methods:
            version += 1
            _perturb(bc.module, version)
            ms = _sync_once(method, bc, worker, version, ckpt, extras)
            if rep > 0:
                times[method].append(ms)
            if rep == args.reps and method == "memcpy":
                verified[method] = torch.equal(extras.dst, extras.src)
            elif rep == args.reps:
                worker.send(("checksum",))
                verified[method] = worker.recv() == weights_checksum(bc.module)
        if rep > 0:
            done = ", ".join(f"{m} {times[m][-1]:.0f} ms" for m in args.methods)
            print(f"  rep {rep}: {done}", flush=True)
    return {m: {"median_ms": statistics.median(v), "min_ms": min(v), "all_ms": v, "bit_exact": verified[m]}
            for m, v in times.items()}


def bench_drain(args: argparse.Namespace, bc: WeightBroadcaster, worker: Worker, forward_ms: float) -> dict:
    rng = random.Random(args.seed)
    waits: dict[str, list[float]] = {"drain": [], "no_drain": []}
    worker.send(("serve", forward_ms, args.batch))
    time.sleep(0.3)  # steady load before the first update ends
    version, lead = 10**6, lead_ms(args, forward_ms) / 1e3
    for i in range(2 * args.drain_reps):
        mode = ("drain", "no_drain")[(i + i // 2) % 2]  # ABBA order: no systematic drift bias
        update = (args.update_ms + rng.uniform(0.0, forward_ms)) / 1e3  # random phase vs the batches
        if mode == "drain":
            time.sleep(update - lead)
            bc.signal_drain()
            time.sleep(lead)
        else:
            time.sleep(update)
        t_end = time.perf_counter()
        version += 1
        bc.broadcast(version)  # signals at this point if not drained; returns on the worker's ack
        waits[mode].append((time.perf_counter() - t_end) * 1e3)
    worker.send(("stop",))
    served = worker.recv()
    out: dict[str, Any] = {"forward_ms": forward_ms, "lead_ms": lead * 1e3, "served": served}
    for mode, v in waits.items():
        q = statistics.quantiles(v, n=10)
        out[mode] = {"median_ms": statistics.median(v), "mean_ms": statistics.fmean(v), "p90_ms": q[-1],
                     "all_ms": v}
    out["ratio_median"] = out["no_drain"]["median_ms"] / out["drain"]["median_ms"]
    out["ratio_mean"] = out["no_drain"]["mean_ms"] / out["drain"]["mean_ms"]
    return out


def _check_memory(size: str, n: int, dtype: str, device: str) -> None:
    """Host copies alive at once: 2 models + 2 bucket sets + pickle payloads/state dicts ~ 7x the
    weights, + 2 shared slots + the memcpy pair: 11x."""
    need = 11 * n * torch.empty((), dtype=getattr(torch, dtype)).element_size()
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if device == "cpu" and need > 0.8 * free:
        raise SystemExit(f"--sizes {size}: needs about {need / 2**30:.1f} GiB of host memory, "
                         f"{free / 2**30:.1f} GiB free")


def run_size(args: argparse.Namespace, size: str, ckpt_dir: Path, latency: bool, drain: bool) -> dict:
    n, width = parse_size(size)
    trainer_dev, worker_dev, dtype, backend = placement(args.device)
    _check_memory(size, n, dtype, args.device)
    cfg = SyncGroupConfig.local(backend=backend, timeout_s=args.timeout_s, join_timeout_s=300)
    spec = WorkerSpec(n, width, dtype, worker_dev, args.seed + 1, args.bucket_mb, cfg)
    model = make_model(n, getattr(torch, dtype), trainer_dev, args.seed, width)
    shared = None
    if latency and "shared_memory" in args.methods:  # built before the worker starts: it maps the slots
        shared = SharedDoubleBuffer(model, mp.get_context("spawn"), timeout_s=args.timeout_s,
                                    worker_name="bench inference worker")
    worker = Worker(spec, timeout_s=args.timeout_s + 60, shared=shared)
    numel = sum(p.numel() for p in model.parameters())
    width, layers = model_shape(n, width)
    print(f"size {size}: {numel / 1e6:.1f}M params ({layers} x Linear({width}, {width}), {dtype}) "
          f"on {trainer_dev} -> {worker_dev} over {backend}", flush=True)
    row: dict[str, Any] = {"size": size, "params": numel, "width": width, "layers": layers, "dtype": dtype,
                           "backend": backend, "trainer_device": trainer_dev, "worker_device": worker_dev}
    try:
        with WeightBroadcaster(model, cfg, bucket_mb=args.bucket_mb) as bc:
            worker.recv()  # "ready"
            row["bytes"], row["buckets"], row["tensors"] = bc.layout.nbytes, len(bc.layout.buckets), \
                len(bc.layout.slots)
            if latency:
                extras = Extras(shared, bc.layout.nbytes, getattr(torch, dtype), trainer_dev)
                row["latency"] = bench_latency(args, bc, worker, ckpt_dir / f"sync_{size}.pt", extras)
                del extras
            if drain:
                row["drain"] = [bench_drain(args, bc, worker, f) for f in args.forward_ms]
                for d in row["drain"]:
                    with_, without = d["drain"]["median_ms"], d["no_drain"]["median_ms"]
                    print(f"  drain @ forward {d['forward_ms']:g} ms: wait {with_:.1f} ms vs "
                          f"{without:.1f} ms without ({d['ratio_median']:.2f}x)", flush=True)
    finally:
        worker.close()
    return row


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    ckpt_dir = args.ckpt_dir or Path(tempfile.mkdtemp(prefix="fastlight-sync-"))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows = []
    try:
        for size in args.sizes:
            rows.append(run_size(args, size, ckpt_dir, latency=True, drain=size in args.drain_sizes))
        for size in args.drain_sizes:
            if size not in args.sizes:
                rows.append(run_size(args, size, ckpt_dir, latency=False, drain=True))
    finally:
        if args.ckpt_dir is None:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
    result = {"rows": rows, "wall_s": time.perf_counter() - t0, "ckpt_dir": str(ckpt_dir)}
    write_outputs(args, argv, result)
    return result


if __name__ == "__main__":
    main()
