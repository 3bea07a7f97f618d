"""``make gpu-check`` (``python -m benchmarks.gpu_check``): the checks that need a CUDA device, in one
run of a few minutes, written to ``benchmarks/results/gpu.md``.

1. **VLA update**: one bf16 (``bf16-true``) GIPO update of a :class:`~fastlight.vla.policy.VLAPolicy`
   over a tiny Hugging Face VLM (``benchmarks.tiny_vlm``) on the GPU: finite loss, an
   on-policy ratio of 1 up to bf16 rounding, every trainable tensor moved.
2. **Inference worker end to end**: a short ``fit`` whose inference worker shares the trainer's GPU,
   so its weights travel over CUDA IPC (:func:`fastlight.inference.client.weight_path`
   ``"cuda_ipc"``): every batch on-policy, every publish acked, and the slot the worker serves from
   holds the trainer's weights bit for bit.
3. **Same-GPU weight sync** of a ~1B-parameter bf16 model (a stack of ``nn.Linear``, as
   ``benchmarks.sync``): the CUDA IPC double buffer (one on-device copy, a flip, the worker's
   pointer swap) against the gloo broadcast the same pair used before (NCCL cannot group two
   processes on one GPU), median ms per publish (trainer's call until the worker's ack) and GB/s,
   with one device ``copy_`` of the same bytes as the reference; the worker's weights checked.
4. ``pytest -m gpu`` (FSDP, the CUDA IPC tests of ``tests/weights/test_cuda_ipc.py``).

Steps 1-3 take a ``device`` and also run on the CPU (the tests do that: the shared-memory double
buffer then stands in for CUDA IPC), so only the CUDA-specific lines go untested without a GPU.
Exits 0 when every check passed, 1 when one failed, 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = "make gpu-check needs a CUDA device; none found (torch.cuda.is_available() is False)"
# weight_path's answer -> the inference client's transport name (the broadcast is "bucketed" in SyncStats).
TRANSPORT = {"shared_memory": "shared_memory", "cuda_ipc": "cuda_ipc", "bucketed": "broadcast"}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument(
        "--size", default="1B", help="parameters of the sync model, e.g. 1B, 300M (as benchmarks.sync)"
    )
    p.add_argument("--ipc-reps", type=int, default=10, help="timed CUDA IPC publishes (after one warm-up)")
    p.add_argument("--gloo-reps", type=int, default=3, help="timed gloo broadcasts (after one warm-up)")
    p.add_argument("--fit-steps", type=int, default=6, help="training steps of the end-to-end run")
    p.add_argument("--pytest-timeout-s", type=float, default=300.0, help="limit of the pytest -m gpu run")
    p.add_argument("--timeout-s", type=float, default=120.0, help="weight sync timeout")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu.md")
    args = p.parse_args(argv)
    if min(args.ipc_reps, args.gloo_reps, args.fit_steps) < 1:
        raise SystemExit("--ipc-reps, --gloo-reps and --fit-steps must be >= 1")
    return args


# ------------------------------------------------------------------------------------- 1. VLA update
def vla_bf16_update(device: str) -> dict[str, Any]:
    """One GIPO step of a tiny-VLM VLAPolicy cast to bf16 (Lightning's ``bf16-true``) on ``device``."""
    from benchmarks.tiny_vlm import save_tiny_vlm
    from fastlight.envs.instruction_tokens import encode_words
    from fastlight.envs.instructions import INSTRUCTIONS, instruction_words
    from fastlight.losses import gipo_loss
    from fastlight.vla.policy import VLAPolicy

    n, side = 6, 48
    sentences = tuple(INSTRUCTIONS.values())[:3]
    ids, mask = map(torch.from_numpy, encode_words(instruction_words(), list(sentences), 16))
    with tempfile.TemporaryDirectory(prefix="fastlight-gpu-check-") as tmp:
        folder = save_tiny_vlm("llava", Path(tmp) / "llava", sentences=list(INSTRUCTIONS.values()))
        torch.manual_seed(0)
        policy = VLAPolicy(backbone=str(folder), action_dim=4, proprio_dim=4, image_size=side)
        # Bound after the move (the instruction tables go to the policy's device when bound) and while
        # the folder exists (binding reads its tokenizer).
        policy = policy.to(device=device, dtype=torch.bfloat16)
        if not policy.bind_instructions(sentences, ids, mask):
            raise AssertionError("the tiny VLM's tokenizer was not found: no instruction table bound")
    g = torch.Generator().manual_seed(0)
    rows = torch.arange(n) % len(sentences)
    obs = {
        "image": torch.randint(0, 256, (n, side, side, 3), dtype=torch.uint8, generator=g),
        "proprio": torch.randn(n, 4, generator=g),
        "instruction_ids": ids[rows],
        "instruction_mask": mask[rows],
    }
    obs = {k: v.to(device) for k, v in obs.items()}
    t0 = time.perf_counter()
    with torch.no_grad():
        behaviour = policy.eval().act(obs)
    policy.train()
    params = [q for q in policy.policy_parameters() if q.requires_grad]
    before = [q.detach().clone() for q in params]
    opt = torch.optim.Adam(params, lr=1e-2)  # above bf16's spacing near 1: a norm weight moves too
    ev = policy.evaluate(obs, behaviour.actions)
    loss, info = gipo_loss(logprobs=ev.logprobs, old_logprobs=behaviour.logprobs,
                           advantages=torch.linspace(-1.0, 1.0, n, device=device),
                           valid=torch.ones(n, dtype=torch.bool, device=device))  # fmt: skip
    opt.zero_grad()
    loss.backward()
    opt.step()
    if policy.action_queries.is_cuda:
        torch.cuda.synchronize(policy.action_queries.device)
    ms = 1000.0 * (time.perf_counter() - t0)
    moved = sum(int(not torch.equal(a, b)) for a, b in zip(before, params, strict=True))
    out = {
        "loss": float(loss.detach()),
        "ratio_mean": float(info["ratio_mean"]),
        "moved": moved,
        "trainable": len(params),
        "dtypes": sorted({str(p.dtype) for p in policy.parameters()}),
        "ms": ms,
    }
    if not math.isfinite(out["loss"]) or abs(out["ratio_mean"] - 1.0) >= 0.05 or not moved == len(params) > 0:
        raise AssertionError(f"bf16 VLA update: {out}")
    return out


# ------------------------------------------------------------------ 2. inference worker end to end
def _checked_module_class() -> type:
    from fastlight.modules.rl_module import RLModule
    from fastlight.weights.buckets import layout_tensors

    class Checked(RLModule):
        """Records, at every step, what the samplers acted with and what the worker serves from."""

        def on_train_start(self) -> None:
            client = self.trainer.datamodule.pool.client
            self.setup_seen = (client.transport, str(client.trainer_device), str(client.worker_device))
            self.steps: list[dict[str, Any]] = []

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            dm = self.trainer.datamodule
            shared = dm.pool.client.shared
            exact = None
            if shared is not None:  # the slot the worker claimed holds the weights this step starts from
                views = shared.slots[shared.claimed_slot].views
                mine = layout_tensors(self.policy, shared.layout)
                exact = all(
                    v is not None and torch.equal(v, t.detach()) for v, t in zip(views, mine, strict=True)
                )
            self.steps.append({
                "version": int(self.policy_version), "mode": dm.last_sync.mode,
                "latency_ms": dm.last_sync.latency_ms,
                "behaviour": batch.policy_version[batch.valid].unique().tolist(),
                "acked": None if shared is None else shared.acked_version, "exact": exact,
            })  # fmt: skip
            return super().training_step(batch, batch_idx)

    return Checked


def inference_end_to_end(device: str, steps: int = 6) -> dict[str, Any]:
    """A ``steps``-step fit on CartPole whose inference worker sits on the trainer's ``device``."""
    import lightning as L

    from fastlight.callbacks.weight_sync import WeightSync
    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.inference.client import weight_path
    from fastlight.inference.settings import InferenceSettings

    path = weight_path(device, device)
    dm = RolloutDataModule(
        env_id="CartPole-v1",
        num_envs=2,
        num_workers=1,
        max_horizon=32,
        inference=InferenceSettings(max_wait_ms=1.0),
    )  # worker device: the trainer's
    model = _checked_module_class()(
        obs_dim=dm.obs_dim,
        action_dim=dm.action_dim,
        continuous=dm.continuous,
        update_epochs=1,
        num_minibatches=1,
    )
    accelerator = "gpu" if torch.device(device).type == "cuda" else "cpu"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fastlight-gpu-check-") as tmp:
        trainer = L.Trainer(accelerator=accelerator, devices=1, max_steps=steps, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[WeightSync()], default_root_dir=tmp)  # fmt: skip
        trainer.fit(model, datamodule=dm)
    wall_s = time.perf_counter() - t0
    rows = model.steps
    out = {
        "transport": model.setup_seen[0], "trainer_device": model.setup_seen[1],
        "worker_device": model.setup_seen[2], "steps": len(rows), "modes": sorted({r["mode"] for r in rows}),
        "on_policy": all(r["behaviour"] == [r["version"]] for r in rows),
        "acked": all(r["acked"] in (None, r["version"]) for r in rows),
        "slot_exact": all(r["exact"] is not False for r in rows),
        "median_sync_ms": statistics.median(r["latency_ms"] for r in rows), "wall_s": wall_s,
    }  # fmt: skip
    ok = (
        out["transport"] == TRANSPORT[path]
        and out["modes"] == [path]
        and out["steps"] == steps
        and out["on_policy"]
        and out["acked"]
        and out["slot_exact"]
    )
    if not ok:
        raise AssertionError(f"inference worker on {device} (expected the {path!r} path): {out}")
    return out


# ---------------------------------------------------------------------------- 3. same-GPU weight sync
def _perturb(model: torch.nn.Module, version: int) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * ((version % 7) + 1))


def _slot_matches(shared: Any, model: torch.nn.Module) -> bool:
    from fastlight.weights.buckets import layout_tensors

    views = shared.slots[shared.claimed_slot].views
    mine = layout_tensors(model, shared.layout)
    return all(v is not None and torch.equal(v, t.detach()) for v, t in zip(views, mine, strict=True))


def same_device_sync(
    device: str,
    size: str = "1B",
    ipc_reps: int = 10,
    gloo_reps: int = 3,
    timeout_s: float = 120.0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Trainer -> worker weight sync of a ``size`` bf16 model, both on ``device``: the double buffer
    there (CUDA IPC on a GPU, shared memory on the CPU) vs the gloo broadcast, and one ``copy_``."""
    import torch.multiprocessing as mp

    from benchmarks.checksums import weights_checksum
    from benchmarks.sync.__main__ import Worker
    from benchmarks.sync.worker import WorkerSpec, make_model, model_shape, parse_size
    from fastlight.weights.broadcast import SyncGroupConfig, WeightBroadcaster, choose_backend
    from fastlight.weights.double_buffer import SharedDoubleBuffer

    dev = torch.device(device)
    cuda = dev.type == "cuda"

    def sync_device() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    n, width = parse_size(size)
    width, layers = model_shape(n, width)
    model = make_model(n, torch.bfloat16, dev, seed=0, width=width)
    backend = choose_backend(dev, dev)  # what the same pair used before the CUDA IPC path: gloo
    cfg = SyncGroupConfig.local(backend=backend, timeout_s=timeout_s, join_timeout_s=300)
    # Built before the worker starts: its slots (and, on a GPU, their IPC handles) travel with the worker's
    # start-up arguments, once.
    shared = SharedDoubleBuffer(
        model,
        mp.get_context("spawn"),
        timeout_s=timeout_s,
        device=dev,
        worker_name="gpu-check inference worker",
    )
    spec = WorkerSpec(n, width, "bfloat16", str(dev), 1, 64.0, cfg)
    worker = Worker(spec, timeout_s=timeout_s + 60, shared=shared)
    nbytes = shared.nbytes
    params = sum(p.numel() for p in model.parameters())
    row: dict[str, Any] = {"params": params, "width": width, "layers": layers, "bytes": nbytes,
                           "device": str(dev), "backend": backend}  # fmt: skip
    log(
        f"sync: {row['params'] / 1e6:.0f}M bf16 params ({layers} x Linear({width}, {width}), "
        f"{nbytes / 1e9:.2f} GB) on {dev}, double buffer vs {backend} broadcast"
    )
    try:
        with WeightBroadcaster(model, cfg, bucket_mb=64.0) as bc:
            worker.recv()  # "ready": joined the group, mapped the slots
            version = 0
            methods: dict[str, dict[str, Any]] = {}
            # The broadcast first, into the worker's own tensors (as before this path existed); then the
            # double buffer, after whose first publish the worker's tensors are the slot's views.
            for method, reps in (("broadcast", gloo_reps), ("double_buffer", ipc_reps)):
                times, mode = [], ""
                for rep in range(reps + 1):  # rep 0 warms up (first copies, connections)
                    version += 1
                    _perturb(model, version)
                    sync_device()  # the perturbation is not part of the publish
                    if method == "double_buffer":
                        worker.send(("shared_memory", version))  # the worker's "swap to the new slot"
                        t0 = time.perf_counter()
                        mode = shared.publish(model, version, check=worker.check).mode
                    else:
                        worker.send(("bucketed", version))
                        t0 = time.perf_counter()
                        mode = bc.broadcast(version).mode
                    ms = 1000.0 * (time.perf_counter() - t0)  # the trainer's call, until the worker's ack
                    got = worker.recv()
                    if got != version:
                        raise AssertionError(f"{method}: the worker acked {got}, expected {version}")
                    if rep > 0:
                        times.append(ms)
                worker.send(("checksum",))
                # float64 sums on two devices' copies laid out differently (slot views vs tensors of
                # their own) may round apart in the last bits; a stale or half-copied model is far off.
                same = math.isclose(worker.recv(), weights_checksum(model), rel_tol=1e-12)
                if method == "double_buffer":  # and the slot the worker serves from, byte for byte
                    same = same and _slot_matches(shared, model)
                med = statistics.median(times)
                methods[method] = {"mode": mode, "median_ms": med, "min_ms": min(times), "reps": len(times),
                                   "gb_s": nbytes / (med / 1e3) / 1e9, "verified": same}  # fmt: skip
                log(
                    f"  {mode}: median {med:.1f} ms per publish ({methods[method]['gb_s']:.1f} GB/s), "
                    f"worker's weights {'match' if same else 'DIFFER'}"
                )
    finally:
        worker.close()
    src = torch.randn(nbytes // 2, device=dev).to(torch.bfloat16)
    dst = torch.zeros_like(src)
    copies = []
    for rep in range(ipc_reps + 1):
        sync_device()
        t0 = time.perf_counter()
        dst.copy_(src)
        sync_device()
        if rep > 0:
            copies.append(1000.0 * (time.perf_counter() - t0))
    med = statistics.median(copies)
    methods["copy"] = {
        "mode": "copy_",
        "median_ms": med,
        "min_ms": min(copies),
        "reps": len(copies),
        "gb_s": nbytes / (med / 1e3) / 1e9,
        "verified": bool(torch.equal(dst, src)),
    }
    row["methods"] = methods
    row["speedup"] = methods["broadcast"]["median_ms"] / methods["double_buffer"]["median_ms"]
    if not all(m["verified"] for m in methods.values()):
        raise AssertionError(f"same-device sync: a copy differs: {methods}")
    return row


# ------------------------------------------------------------------------------------- 4. pytest -m gpu
def pytest_gpu(timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"pytest -m gpu did not finish within {timeout_s:g} s") from exc
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else "(no output)"  # -q: "N passed, M deselected in S s"
    out = {"rc": proc.returncode, "summary": summary, "wall_s": time.perf_counter() - t0}
    if proc.returncode != 0:
        raise AssertionError(f"pytest -m gpu exited {proc.returncode}: {summary}\n{proc.stdout[-3000:]}")
    return out


# ----------------------------------------------------------------------------------------------- report
def _describe(name: str, value: dict[str, Any]) -> str:
    if name == "vla":
        return (
            f"loss {value['loss']:.4f}, ratio {value['ratio_mean']:.4f}, "
            f"{value['moved']}/{value['trainable']} trainable tensors moved, {'/'.join(value['dtypes'])}"
        )
    if name == "inference":
        return (
            f"transport {value['transport']} ({value['trainer_device']} -> {value['worker_device']}), "
            f"{value['steps']} steps on-policy, every publish acked, slot bit-exact, median sync "
            f"{value['median_sync_ms']:.1f} ms"
        )
    if name == "sync":
        m = value["methods"]
        return (
            f"{m['double_buffer']['mode']} {m['double_buffer']['median_ms']:.1f} ms vs "
            f"{value['backend']} {m['broadcast']['median_ms']:.0f} ms per publish ({value['speedup']:.1f}x)"
        )
    return str(value.get("summary", value))


def write_report(
    path: Path, command: str, device_name: str, results: dict[str, dict[str, Any]], wall_s: float
) -> str:
    """``gpu.md``: the command, the device, one line per check, the sync table."""
    titles = {
        "vla": "bf16 VLA update",
        "inference": "CUDA inference worker end to end",
        "sync": "same-GPU weight sync",
        "pytest": "pytest -m gpu",
    }
    lines = [
        "# GPU check (`make gpu-check`)", "",
        f"Command: `{command}`  ", f"Device: {device_name}  ",
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {wall_s:.0f} s in all", "",
        "| check | result | time |", "|---|---|---|",
    ]  # fmt: skip
    for key, title in titles.items():
        r = results.get(key)
        if r is None:
            continue
        secs = r.get("seconds", 0.0)
        text = f"FAILED: {r['error']}" if "error" in r else f"passed: {_describe(key, r['value'])}"
        lines.append(f"| {title} | {text.replace('|', '/')} | {secs:.1f} s |")
    sync = results.get("sync", {}).get("value")
    if sync is not None:
        labels = {
            "double_buffer": f"double buffer ({sync['methods']['double_buffer']['mode']})",
            "broadcast": f"{sync['backend']} broadcast (bucketed)",
            "copy": "one device copy_ (reference)",
        }
        lines += [
            "", f"## Same-GPU weight sync: {sync['params'] / 1e6:.0f}M bf16 parameters ({sync['layers']} "
            f"x Linear({sync['width']}, {sync['width']}), {sync['bytes'] / 1e9:.2f} GB) on {sync['device']}",
            "",
            "Per publish: the trainer's call until the worker acked the new weights in place (after one "
            "warm-up). The double buffer copies once into the free slot on the GPU, waits for the copy on "
            "the device, flips; the worker swaps its tensors onto the slot (IPC handles opened once, at "
            "start-up). The broadcast is what this pair used before: gloo (NCCL refuses two processes on "
            "one GPU), through host memory.", "",
            "| path | median ms / publish | min ms | GB/s | reps | worker's weights |",
            "|---|---|---|---|---|---|",
        ]  # fmt: skip
        for key, label in labels.items():
            m = sync["methods"][key]
            lines.append(
                f"| {label} | {m['median_ms']:.2f} | {m['min_ms']:.2f} | {m['gb_s']:.1f} | {m['reps']} | "
                f"{'verified' if m['verified'] else 'DIFFER'} |"
            )
        lines += ["", f"gloo broadcast / double buffer, median per publish: {sync['speedup']:.1f}x."]
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def _step(results: dict[str, dict[str, Any]], key: str, fn: Callable[[], dict[str, Any]]) -> None:
    print(f"== {key}", flush=True)
    t0 = time.perf_counter()
    try:
        results[key] = {"value": fn()}
        print(f"   passed: {_describe(key, results[key]['value'])}", flush=True)
    except Exception as exc:  # noqa: BLE001 -- one failed check is reported, the others still run
        traceback.print_exc()
        results[key] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    results[key]["seconds"] = time.perf_counter() - t0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_CUDA, flush=True)
        return 2
    device = f"cuda:{torch.cuda.current_device()}"
    name = torch.cuda.get_device_name(device)
    print(f"gpu-check on {name} ({device})", flush=True)
    t0 = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    _step(results, "vla", lambda: vla_bf16_update(device))
    _step(results, "inference", lambda: inference_end_to_end(device, args.fit_steps))
    _step(
        results,
        "sync",
        lambda: same_device_sync(device, args.size, args.ipc_reps, args.gloo_reps, args.timeout_s),
    )
    _step(results, "pytest", lambda: pytest_gpu(args.pytest_timeout_s))
    command = shlex.join(["python", "-m", "benchmarks.gpu_check", *(sys.argv[1:] if argv is None else argv)])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f"{name} ({device}{'' if visible is None else f', CUDA_VISIBLE_DEVICES={visible}'})"
    write_report(args.out, command, where, results, time.perf_counter() - t0)
    failed = [k for k, r in results.items() if "error" in r]
    print(
        f"gpu-check: {len(results) - len(failed)}/{len(results)} checks passed"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + f"; wrote {args.out}",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
