"""The same-GPU weight path: the double buffer with its slots on the trainer's GPU, shared by CUDA IPC.

On the CPU (every run): which path :func:`weight_path` picks for a pair of devices, that the
inference client builds the double buffer on the trainer's GPU for a worker there, that the
device-generalised buffer is still the bit-exact shared-memory path on the CPU and refuses a
device or a worker it cannot serve, and ``make gpu-check``: its script's line and exit code without
CUDA, its make target, and its checks run on the CPU (the shared-memory double buffer standing in
for CUDA IPC).

On a GPU (``pytest -m gpu``): the CPU double-buffer tests again with CUDA slots (one copy, pointer
swaps into the slot, the held slot never written), a spawned worker on the same GPU that opens the
slots' IPC handles once and gets every version bit for bit, a serving worker that never sees a torn
model while the trainer publishes as fast as it can (drains included), and a whole fit whose
inference worker shares the trainer's GPU.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from benchmarks import gpu_check
from fastlight.inference import client as client_module
from fastlight.inference.client import InferenceClient, weight_path
from fastlight.inference.server import serve_until
from fastlight.inference.settings import InferenceSettings
from fastlight.models.mlp import MLPActorCritic
from fastlight.weights.broadcast import WeightSyncError, choose_backend
from fastlight.weights.buckets import layout_tensors, sync_entries
from fastlight.weights.double_buffer import SharedDoubleBuffer, slot_device
from tests.weights.test_broadcast import Mixed, _bits

CTX = mp.get_context("spawn")
DEV = "cuda:0"
ROOT = Path(__file__).resolve().parents[2]


def _inside(t: torch.Tensor, buf: torch.Tensor) -> bool:
    start = buf.data_ptr()
    return start <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= \
        start + buf.numel() * buf.element_size()  # fmt: skip


def _slot_of(module: nn.Module, shared: SharedDoubleBuffer) -> set[int]:
    """Which slot each synced tensor lives in (-1: outside both)."""
    out = set()
    for _, t in sync_entries(module):
        where = [i for i, slot in enumerate(shared.slots) if any(_inside(t, b) for b in slot.buckets)]
        out.add(where[0] if where else -1)
    return out


def _assert_same_bits(a: nn.Module, b: nn.Module) -> None:
    want, got = dict(sync_entries(a)), dict(sync_entries(b))
    assert list(want) == list(got)
    for k in want:
        assert torch.equal(_bits(want[k].cpu()), _bits(got[k].cpu())), k


def _perturb(module: Mixed, seed: int) -> None:
    """``Mixed.perturb`` on the module's own device: new values for every synced tensor."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.device, p.dtype))
        module.scale.mul_(1.5)
    module.train()
    module.norm(torch.randn(16, module.norm.num_features, generator=g).to(module.norm.weight.device))


def _dump(module: nn.Module) -> bytes:
    """The synced tensors as host bytes (nothing CUDA crosses the result queue)."""
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu().clone() for k, v in sync_entries(module)}, buf)
    return buf.getvalue()


def _assert_bitwise(module: nn.Module, blob: bytes) -> None:
    got = torch.load(io.BytesIO(blob), weights_only=True)
    want = dict(sync_entries(module))
    assert list(got) == list(want)
    for k, v in want.items():
        assert torch.equal(_bits(got[k]), _bits(v.cpu())), k


# ============================================================================================ CPU
def test_weight_path_is_cuda_ipc_exactly_when_both_ends_are_on_one_gpu() -> None:
    assert weight_path("cuda:0", "cuda:0") == weight_path("cuda:3", "cuda:3") == "cuda_ipc"
    assert weight_path("cuda", "cuda:0") == weight_path("cuda:0", "cuda") == "cuda_ipc"  # bare cuda = 0
    assert weight_path("cuda:0", "cuda:1") == weight_path("cuda", "cuda:1") == "bucketed"
    assert weight_path("cpu", "cuda:0") == "bucketed"  # a CPU trainer's CUDA worker
    assert weight_path("cpu", "cpu") == weight_path("cuda:0", "cpu") == "shared_memory"
    assert weight_path(torch.device("cuda", 2), torch.device("cuda:2")) == "cuda_ipc"
    # The broadcast's backend where it remains: NCCL between two GPUs, gloo from the CPU.
    assert choose_backend("cuda:0", "cuda:1") == "nccl" and choose_backend("cpu", "cuda:0") == "gloo"


class _Recorded:
    """Stands in for SharedDoubleBuffer where CUDA is missing: records where it was asked to live."""

    calls: list[dict] = []

    def __init__(self, module: nn.Module, ctx: object, **kw: object) -> None:
        type(self).calls.append(kw)


def test_the_client_puts_the_double_buffer_on_the_gpu_the_trainer_and_its_worker_share(monkeypatch) -> None:
    policy, obs = MLPActorCritic(3, 2), torch.zeros(2, 3)
    monkeypatch.setattr(client_module, "SharedDoubleBuffer", _Recorded)
    _Recorded.calls = []
    same = InferenceClient(CTX, policy, obs, [2], InferenceSettings(), trainer_device="cuda:0")
    assert (same.transport, same.worker_device, same.sync_config) == (
        "cuda_ipc",
        torch.device("cuda:0"),
        None,
    )
    assert [c["device"] for c in _Recorded.calls] == [torch.device("cuda:0")]
    assert isinstance(same.shared, _Recorded) and same.restartable
    monkeypatch.undo()
    # A CPU worker of a GPU trainer keeps the host shared-memory slots (the publish copies device -> host).
    cpu = InferenceClient(CTX, policy, obs, [2], InferenceSettings(device="cpu"), trainer_device="cuda:0")
    assert cpu.transport == "shared_memory" and cpu.shared is not None
    assert cpu.shared.device == torch.device("cpu") and cpu.shared.mode == "shared_memory"
    assert all(b.is_shared() for slot in cpu.shared.slots for b in slot.buckets)


def test_the_buffer_named_on_the_cpu_is_still_one_copy_and_pointer_swaps_bit_for_bit() -> None:
    trainer, worker = Mixed(seed=0), Mixed(seed=1)
    shared = SharedDoubleBuffer(trainer, CTX, timeout_s=5, device="cpu")
    assert (shared.device, shared.mode, shared.label) == (
        torch.device("cpu"),
        "shared_memory",
        "shared-memory",
    )
    assert all(b.is_shared() and b.device.type == "cpu" for slot in shared.slots for b in slot.buckets)
    reader = shared.attach(worker, name="test worker")
    ids = [id(t) for t in layout_tensors(worker, shared.layout)]
    for version in range(3):
        _perturb(trainer, seed=version)
        stats = shared.publish(trainer, version, wait=False)
        assert (stats.mode, stats.bytes, stats.collectives) == ("shared_memory", shared.layout.nbytes, 0)
        assert reader.receive() == version and shared.acked_version == version
        assert _slot_of(worker, shared) == {version % 2}
        assert [id(t) for t in layout_tensors(worker, shared.layout)] == ids
        _assert_same_bits(trainer, worker)


def test_slot_devices_are_the_cpu_or_an_indexed_gpu() -> None:
    assert slot_device("cpu") == torch.device("cpu")
    with pytest.raises(
        ValueError, match=r"^SharedDoubleBuffer.device must be 'cpu' or 'cuda\[:N\]', got 'meta'$"
    ):
        slot_device("meta")
    if torch.cuda.is_available():
        assert slot_device("cuda") == torch.device("cuda:0")  # what a fresh worker's "cuda" is
    else:
        with pytest.raises(ValueError, match=r"device is 'cuda:1' but torch.cuda.is_available\(\) is False$"):
            SharedDoubleBuffer(Mixed(seed=0), CTX, device="cuda:1")


def test_a_worker_whose_weights_are_not_where_the_slots_are_is_refused() -> None:
    shared = SharedDoubleBuffer(Mixed(seed=0), CTX)
    with pytest.raises(
        WeightSyncError, match=r"^shared-memory weight sync needs CPU weights; odd worker has meta$"
    ):
        shared.attach(Mixed(seed=0).to("meta"), name="odd worker")


def test_gpu_check_without_cuda_says_so_in_one_line_and_exits_2(tmp_path) -> None:
    out = tmp_path / "gpu.md"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no device visible, even on a GPU machine
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert proc.stdout == gpu_check.NO_CUDA + "\n", proc.stderr[-2000:]
    assert gpu_check.NO_CUDA == (
        "make gpu-check needs a CUDA device; none found (torch.cuda.is_available() is False)"
    )
    assert proc.returncode == 2 and not out.exists()


def test_make_gpu_check_runs_the_script() -> None:
    # --no-print-directory: under `make test` this make is nested and would print its directory.
    cmd = ["make", "--no-print-directory", "-n", "gpu-check"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].endswith("/bin/python -m benchmarks.gpu_check")  # $(BIN)/python


@pytest.mark.multiproc
def test_gpu_check_sync_and_report_run_on_the_cpu(tmp_path) -> None:
    row = gpu_check.same_device_sync("cpu", "2M", ipc_reps=2, gloo_reps=1, timeout_s=30, log=lambda _: None)
    m = row["methods"]
    modes = (m["double_buffer"]["mode"], m["broadcast"]["mode"], row["backend"])
    assert modes == ("shared_memory", "bucketed", "gloo")
    assert row["bytes"] == 2 * row["params"] == 2 * 8 * (512 * 512 + 512)  # bf16, 8 x Linear(512, 512)
    assert [m[k]["reps"] for k in ("double_buffer", "broadcast", "copy")] == [2, 1, 2]
    assert all(m[k]["verified"] for k in m)
    assert row["speedup"] == m["broadcast"]["median_ms"] / m["double_buffer"]["median_ms"]
    db = m["double_buffer"]
    assert db["gb_s"] == pytest.approx(row["bytes"] / (db["median_ms"] / 1e3) / 1e9)
    results = {
        "sync": {"value": row, "seconds": 3.5},
        "vla": {"error": "AssertionError: bf16 VLA", "seconds": 0.5},
    }
    text = gpu_check.write_report(tmp_path / "gpu.md", "python -m benchmarks.gpu_check", "cpu", results, 4.0)
    assert (tmp_path / "gpu.md").read_text() == text
    lines = text.splitlines()
    assert "Command: `python -m benchmarks.gpu_check`  " in lines and "Device: cpu  " in lines
    assert "| bf16 VLA update | FAILED: AssertionError: bf16 VLA | 0.5 s |" in lines
    passed = f"passed: shared_memory {db['median_ms']:.1f} ms vs gloo {m['broadcast']['median_ms']:.0f} ms"
    assert f"| same-GPU weight sync | {passed} per publish ({row['speedup']:.1f}x) | 3.5 s |" in lines
    numbers = f"{db['median_ms']:.2f} | {db['min_ms']:.2f} | {db['gb_s']:.1f} | 2"
    assert f"| double buffer (shared_memory) | {numbers} | verified |" in lines


def test_gpu_check_vla_update_runs_on_the_cpu() -> None:
    got = gpu_check.vla_bf16_update("cpu")
    assert got["dtypes"] == ["torch.bfloat16"] and got["moved"] == got["trainable"] > 0
    assert abs(got["ratio_mean"] - 1.0) < 0.05


@pytest.mark.multiproc
def test_gpu_check_inference_run_takes_the_cpu_workers_path_on_the_cpu() -> None:
    got = gpu_check.inference_end_to_end("cpu", steps=3)
    assert (got["transport"], got["modes"], got["trainer_device"], got["worker_device"]) == (
        "shared_memory", ["shared_memory"], "cpu", "cpu")  # fmt: skip
    assert got["steps"] == 3 and got["on_policy"] and got["acked"] and got["slot_exact"]


# ============================================================================================ GPU
def _needs_cuda() -> None:
    assert torch.cuda.is_available(), "gpu-marked test run without a GPU"


@pytest.mark.gpu
def test_cuda_publish_is_one_copy_and_the_worker_swaps_onto_the_gpu_slot() -> None:
    _needs_cuda()
    trainer, worker = Mixed(seed=0).to(DEV), Mixed(seed=1).to(DEV)
    shared = SharedDoubleBuffer(trainer, CTX, timeout_s=5, device=DEV)
    assert (shared.mode, shared.label, shared.device) == ("cuda_ipc", "CUDA IPC", torch.device(DEV))
    assert all(b.device == torch.device(DEV) for slot in shared.slots for b in slot.buckets)
    reader = shared.attach(worker, name="test worker")
    ids = [id(t) for t in layout_tensors(worker, shared.layout)]
    assert _slot_of(worker, shared) == {-1}
    for version in range(4):
        _perturb(trainer, seed=version)
        stats = shared.publish(trainer, version, wait=False)
        assert stats.mode == "cuda_ipc" and stats.bytes == shared.layout.nbytes
        assert reader.receive() == version
        assert _slot_of(worker, shared) == {version % 2}
        assert [id(t) for t in layout_tensors(worker, shared.layout)] == ids
        _assert_same_bits(trainer, worker)
    # From the trainer's CPU copy too (the publish copies host -> device).
    cpu_trainer = Mixed(seed=7)
    shared.publish(cpu_trainer, 4, wait=False)
    assert reader.receive() == 4
    _assert_same_bits(cpu_trainer, worker)


@pytest.mark.gpu
def test_cuda_trainer_never_writes_the_slot_the_worker_holds() -> None:
    _needs_cuda()
    trainer, worker = Mixed(seed=0).to(DEV), Mixed(seed=1).to(DEV)
    shared = SharedDoubleBuffer(trainer, CTX, timeout_s=0.3, device=DEV, worker_name="slow worker (pid 42)")
    reader = shared.attach(worker, name="test worker")
    shared.publish(trainer, 0, wait=False)
    reader.receive()
    before = Mixed(seed=9).to(DEV)
    before.load_state_dict(worker.state_dict())
    _perturb(trainer, seed=1)
    shared.publish(trainer, 1, wait=False)  # slot 1 written and flipped, not taken yet
    _assert_same_bits(before, worker)  # still exactly version 0
    held = [b.clone() for b in shared.slots[0].buckets]
    with pytest.raises(
        WeightSyncError, match=r"^CUDA IPC weight sync: the slow worker \(pid 42\).*leave slot 0"
    ):
        shared.publish(trainer, 2, wait=False)
    assert all(torch.equal(a, b) for a, b in zip(held, shared.slots[0].buckets, strict=True))
    with pytest.raises(
        WeightSyncError, match=r"CUDA IPC weight sync needs weights on cuda:0; cpu worker has cpu$"
    ):
        shared.attach(Mixed(seed=0), name="cpu worker")


def _alive(proc, q) -> Callable[[], None]:
    """A publish's liveness check: raises with what the worker reported once it is gone."""

    def check() -> None:
        if not proc.is_alive():
            reported = q.get(timeout=5) if not q.empty() else None
            raise RuntimeError(f"worker exited with code {proc.exitcode}: {reported}")

    return check


def _ipc_worker(shared: SharedDoubleBuffer, n: int, q) -> None:
    try:
        model = Mixed(seed=123).to(DEV)
        # shared.slots were opened from their IPC handles when the Process arguments were unpickled.
        assert all(b.device == torch.device(DEV) for slot in shared.slots for b in slot.buckets)
        reader = shared.attach(model, name="spawned worker")
        for _ in range(n):
            while not reader.sync_pending():
                time.sleep(0.001)
            version = reader.receive()
            # Its tensors now live in the slot it mapped at start-up (this process's mapping of it).
            q.put((version, _dump(model), _slot_of(model, shared)))
    except BaseException as exc:  # noqa: BLE001 -- report anything to the test
        q.put(("error", repr(exc), None))


@pytest.mark.gpu
@pytest.mark.multiproc
def test_a_spawned_worker_on_the_same_gpu_gets_every_version_bit_for_bit() -> None:
    _needs_cuda()
    trainer = Mixed(seed=0).to(DEV)
    shared = SharedDoubleBuffer(trainer, CTX, timeout_s=60, device=DEV, worker_name="spawned worker")
    q = CTX.Queue()
    proc = CTX.Process(target=_ipc_worker, args=(shared, 4, q), daemon=True)
    proc.start()
    try:
        for i, version in enumerate((5, 6, 7, 8)):
            _perturb(trainer, seed=version)
            stats = shared.publish(trainer, version, check=_alive(proc, q))  # returns once the worker acked
            assert stats.mode == "cuda_ipc" and shared.acked_version == version
            got_version, got, slots = q.get(timeout=60)
            assert got_version == version, got
            _assert_bitwise(trainer, got)
            assert slots == {i % 2}  # slots alternate: 0, 1, 0, 1
    finally:
        proc.join(timeout=20)
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert proc.exitcode == 0


class Wide(nn.Module):
    """Six 16 MiB fp32 matrices: a copy long enough that a flip before it ends would be seen."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(2048, 2048) for _ in range(6))


def _fill(module: nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(value)


def _serving_worker(shared: SharedDoubleBuffer, stop, q) -> None:
    try:
        model = Wide().to(DEV)
        reader = shared.attach(model, name="serving worker", stopped=stop.is_set)
        seen = {"forwards": 0, "torn": 0, "versions": []}

        def serve_once() -> None:  # one "forward": reads every published tensor on the GPU
            if reader.version < 0:
                time.sleep(0.001)
                return
            x = torch.ones(64, 2048, device=DEV)
            for layer in model.layers:  # a real forward on the slot, then what it must have read
                x = layer(x).tanh()
            lo = torch.stack([p.amin() for p in model.parameters()]).cpu()
            hi = torch.stack([p.amax() for p in model.parameters()]).cpu()
            seen["forwards"] += 1
            whole = bool((lo == reader.version).all()) and bool((hi == reader.version).all())
            seen["torn"] += int(not whole)

        serve_until(reader, model, stopped=stop.is_set, serve_once=serve_once,
                    on_sync=lambda v: seen["versions"].append(v))  # fmt: skip
        q.put(seen)
    except BaseException as exc:  # noqa: BLE001 -- report anything to the test
        q.put({"error": repr(exc)})


@pytest.mark.gpu
@pytest.mark.multiproc
def test_a_serving_worker_never_reads_a_torn_model_while_the_trainer_publishes() -> None:
    _needs_cuda()
    trainer = Wide().to(DEV)
    shared = SharedDoubleBuffer(trainer, CTX, timeout_s=60, device=DEV, worker_name="serving worker")
    stop, q = CTX.Event(), CTX.Queue()
    proc = CTX.Process(target=_serving_worker, args=(shared, stop, q), daemon=True)
    proc.start()

    try:
        versions = list(range(1, 41))  # every value exact in fp32: a mix of two versions is visible
        for v in versions:
            if v % 2:  # half of them announced during the "update" (drain), half found between forwards
                shared.request_drain()
            _fill(trainer, float(v))
            stats = shared.publish(trainer, v, check=_alive(proc, q))
            assert stats.mode == "cuda_ipc" and shared.acked_version == v
            time.sleep(0.002 * (v % 3))  # let some forwards run on this version
        stop.set()
        seen = q.get(timeout=60)
    finally:
        stop.set()
        proc.join(timeout=20)
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert "error" not in seen, seen
    assert seen["versions"] == versions and seen["torn"] == 0 and seen["forwards"] > 0, seen


@pytest.mark.gpu
@pytest.mark.multiproc
def test_every_forward_of_a_worker_on_the_trainers_gpu_uses_a_whole_published_model(tmp_path) -> None:
    _needs_cuda()
    import lightning as L

    from fastlight.callbacks.weight_sync import WeightSync
    from fastlight.data.datamodule import RolloutDataModule
    from tests.inference.test_inference import FIXED, Audited
    from tests.lightning_helpers import wait_no_children

    audit = tmp_path / "forwards.txt"
    dm = RolloutDataModule(env_id=FIXED, env_kwargs={"lengths": (3, 5)}, num_envs=4, num_workers=2,
                           inference=InferenceSettings(max_wait_ms=1.0))  # fmt: skip
    model = Audited(obs_dim=3, action_dim=2, update_epochs=2, num_minibatches=2)
    model.audit_path = str(audit)
    sync = WeightSync(drain=True)
    L.Trainer(accelerator="gpu", devices=1, max_steps=4 * 6, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False, callbacks=[sync],
              default_root_dir=tmp_path).fit(model, datamodule=dm)  # fmt: skip
    assert sync.drains == 6
    assert model.sync_setup == ("cuda_ipc", DEV, DEV)
    assert model.sync_modes == {"cuda_ipc"}
    forwards = [float(line) for line in audit.read_text().splitlines()]
    assert len(forwards) > 20
    served = set()
    for checksum in forwards:  # each forward's weights are exactly one published version's
        match = [v for v, c in model.published.items() if checksum == pytest.approx(c, rel=1e-12)]
        assert len(match) == 1, (checksum, model.published)
        served.add(match[0])
    assert set(range(6)) <= served <= set(range(7))
    assert model.seen == [(v, [v]) for v in range(6)]
    wait_no_children()
