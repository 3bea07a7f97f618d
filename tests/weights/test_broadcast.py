"""Trainer -> inference-worker weight broadcast (AcceRL §NCCL weight synchronization), over gloo.

In-process: the fixed order and the flat-bucket packing round trip, which the samplers' shared memory
and the Ray object store use too (every dtype bit for bit). Multi-process (spawned
receivers): two versions arrive bit for bit, per-tensor == bucketed, the group works next to an
initialised default group, a layout mismatch is refused, and a dead or stalled receiver makes the
sender raise ``WeightSyncError`` within the timeout instead of hanging.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from benchmarks.sync import __main__ as bench_sync
from benchmarks.sync.per_tensor import PER_TENSOR
from fastlight.fleet.ray.sampler_actor import ActorWeights, StoreWeights
from fastlight.weights.broadcast import (
    TRAINER_RANK,
    SyncGroupConfig,
    WeightBroadcaster,
    WeightReceiver,
    WeightSyncError,
    choose_backend,
    free_port,
)
from fastlight.weights.buckets import PackedWeights, plan_buckets, sync_entries
from fastlight.weights.shared_memory import SharedWeights

CTX = mp.get_context("spawn")


class Mixed(nn.Module):
    """fp32 + fp64 + bf16 parameters, BatchNorm floating buffers and an integer buffer."""

    def __init__(self, seed: int, width: int = 24) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(8, width)
        self.norm = nn.BatchNorm1d(width)
        self.head = nn.Linear(width, 3).to(torch.float64)
        self.emb = nn.Parameter(torch.randn(5, 4).to(torch.bfloat16))
        self.register_buffer("scale", torch.rand(7, dtype=torch.float16))

    def perturb(self, seed: int) -> None:
        """New values for every synced tensor (BN running stats through a train-mode forward)."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype))
            self.scale.mul_(1.5)
        self.train()
        self.norm(torch.randn(16, self.norm.num_features, generator=g))


def _init_default_group() -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _dump(module: nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.save({k: v.detach().clone() for k, v in sync_entries(module)}, buf)
    return buf.getvalue()


def _assert_bitwise(module: nn.Module, blob: bytes) -> None:
    got = torch.load(io.BytesIO(blob), weights_only=True)
    want = dict(sync_entries(module))
    assert list(got) == list(want)
    for k, v in want.items():
        assert torch.equal(_bits(got[k]), _bits(v)), k


# ------------------------------------------------------------------------------ receiver processes
def _receiver(
    cfg: SyncGroupConfig, n_syncs: int, q, init_default_group: bool, per_tensor_from: int = -1
) -> None:
    try:
        if init_default_group:  # e.g. Lightning DDP in the worker: must not interfere
            _init_default_group()
        model = Mixed(seed=123)
        rx = WeightReceiver(model, cfg, bucket_mb=0.001, name="test-worker")
        for i in range(n_syncs):
            deadline = time.monotonic() + 20
            while not rx.sync_pending():  # the drain signal decides when to join
                assert time.monotonic() < deadline, "no sync announced"
                time.sleep(0.002)
            version = rx.receive(transport=PER_TENSOR) if 0 <= per_tensor_from <= i else rx.receive()
            q.put((version, _dump(model), rx.sync_pending()))
        rx.close()
    except BaseException as exc:  # noqa: BLE001 -- report anything to the test
        q.put(("error", repr(exc), None))


def _dying_receiver(cfg: SyncGroupConfig) -> None:
    rx = WeightReceiver(Mixed(seed=5), cfg, bucket_mb=0.001, name="dying-worker")
    while not rx.sync_pending():
        time.sleep(0.002)
    header = torch.zeros(4, dtype=torch.int64)
    rx.group.bcast(header, TRAINER_RANK).wait()  # joins the sync, then dies mid-way
    os._exit(3)


def _stalled_receiver(cfg: SyncGroupConfig) -> None:
    rx = WeightReceiver(Mixed(seed=5), cfg, bucket_mb=0.001, name="stalled-worker")
    time.sleep(60)  # alive, never joins the broadcast
    rx.close()


def _mismatched_receiver(cfg: SyncGroupConfig, q, width: int = 25, direct_mb: float | None = None) -> None:
    try:
        WeightReceiver(Mixed(seed=5, width=width), cfg, bucket_mb=0.001, name="odd-worker",
                       direct_mb=direct_mb)
        q.put("joined")
    except WeightSyncError as exc:
        q.put(str(exc))


def _start(target, *args) -> mp.Process:
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def _stop(proc: mp.Process) -> None:
    proc.join(timeout=10)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _get(q, timeout: float = 20.0):
    item = q.get(timeout=timeout)
    assert item[0] != "error", item[1]
    return item


# ------------------------------------------------------------------------------ in-process
def test_order_is_sorted_params_then_floating_buffers() -> None:
    names = [k for k, _ in sync_entries(Mixed(0))]
    params = sorted(k for k, _ in Mixed(0).named_parameters())
    assert names[: len(params)] == params
    assert names[len(params) :] == ["norm.running_mean", "norm.running_var", "scale"]
    assert "norm.num_batches_tracked" not in names


def test_pack_unpack_round_trip_multiple_dtypes_and_bucket_boundaries() -> None:
    src, dst = Mixed(1), Mixed(2)
    for bucket_mb in (64.0, 0.0005):  # one bucket per dtype vs boundaries every few hundred bytes
        layout = plan_buckets(src, bucket_mb)
        cap = int(bucket_mb * 2**20)
        dtypes = {torch.float32, torch.float64, torch.bfloat16, torch.float16}
        assert {b.dtype for b in layout.buckets} == dtypes
        for b in layout.buckets:  # a bucket over the cap holds exactly one (oversized) tensor
            item = torch.empty((), dtype=b.dtype).element_size()
            assert b.numel * item <= cap or len(b.slot_ids) == 1
        packed = PackedWeights.alloc(layout)
        packed.pack([t for _, t in sync_entries(src)])
        other_end = PackedWeights(layout, [b.clone() for b in packed.buckets])
        other_end.unpack([t for _, t in sync_entries(dst)])
        _assert_bitwise(src, _dump(dst))
        dst = Mixed(2)
    assert len(plan_buckets(src, 0.0005).buckets) > len(plan_buckets(src, 64.0).buckets) == 4


def test_shared_memory_and_the_object_store_deliver_every_dtype_bitwise(monkeypatch) -> None:
    """The samplers' two paths pack and unpack with the broadcast's buckets: fp64, bf16 and fp16
    arrive bit for bit (no float32 detour), and ``sync/bytes`` counts each dtype's own size."""
    src = Mixed(1)
    src.perturb(3)
    shared = SharedWeights(src, CTX)
    assert shared.publish(src, version=2).bytes == plan_buckets(src).nbytes
    dst = Mixed(2)
    assert shared.load_into(dst) == 2
    _assert_bitwise(src, _dump(dst))
    # The Ray path: what ray.put stores is a serialized copy; ray.get hands it back.
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(get=lambda ref: ref))
    store, actor, dst = StoreWeights(src), ActorWeights(), Mixed(3)
    actor.offer(5, store.put(SimpleNamespace(put=lambda obj: pickle.loads(pickle.dumps(obj))), src))
    assert actor.load_into(dst) == 5 and store.nbytes == plan_buckets(src).nbytes
    _assert_bitwise(src, _dump(dst))


def test_signature_is_stable_and_detects_layout_changes() -> None:
    assert plan_buckets(Mixed(0)).signature == plan_buckets(Mixed(9)).signature
    assert plan_buckets(Mixed(0)).signature != plan_buckets(Mixed(0, width=25)).signature
    assert plan_buckets(Mixed(0), 64).signature != plan_buckets(Mixed(0), 0.0005).signature
    with pytest.raises(ValueError, match="bucket_mb must be > 0"):
        plan_buckets(Mixed(0), 0)


def test_config_is_picklable_and_validated() -> None:
    cfg = SyncGroupConfig.local(timeout_s=3)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert cfg.timeout.total_seconds() == 3
    with pytest.raises(ValueError, match="backend"):
        SyncGroupConfig(port=1234, backend="mpi")
    with pytest.raises(ValueError, match="port"):
        SyncGroupConfig(port=0)
    assert choose_backend("cuda:0", "cuda:1") == "nccl"
    # One GPU cannot hold both ends of an NCCL group: gloo (a bare "cuda" is device 0).
    assert choose_backend("cuda:1", "cuda:1") == choose_backend("cuda", "cuda:0") == "gloo"
    assert choose_backend("cuda:0", "cpu") == choose_backend("cpu", "cpu") == "gloo"


# ------------------------------------------------------------------------------ multi-process
@pytest.mark.multiproc
def test_two_broadcasts_arrive_bit_for_bit_with_versions() -> None:
    cfg = SyncGroupConfig.local(timeout_s=20, join_timeout_s=60)
    q = CTX.Queue()
    proc = _start(_receiver, cfg, 2, q, True)
    model = Mixed(seed=0)
    _init_default_group()  # as Lightning's DDP would in the trainer
    try:
        with WeightBroadcaster(model, cfg, bucket_mb=0.001) as bc:
            # bucket_mb 0.001 -> direct_mb 0.00025 (262 bytes): the Linear weights go direct.
            assert len(bc.layout.buckets) >= 4 and len(bc.layout.direct) >= 2
            for version in (7, 8):
                model.perturb(version)
                stats = bc.broadcast(version)
                got_version, blob, still_pending = _get(q)
                assert got_version == version == bc.version and not still_pending
                _assert_bitwise(model, blob)
                assert stats.mode == "bucketed"
                assert stats.collectives == len(bc.layout.buckets) + len(bc.layout.direct)
                assert stats.latency_ms > 0 and stats.bytes == bc.layout.nbytes
            assert bc.syncs == 2
            keys = {"latency_ms", "trainer_wait_ms", "bytes", "collectives", "version"}
            assert set(stats.metrics()) == {f"sync/{k}" for k in keys}
    finally:
        dist.destroy_process_group()
        _stop(proc)


@pytest.mark.multiproc
def test_per_tensor_path_equals_bucketed_path() -> None:
    cfg = SyncGroupConfig.local(timeout_s=20, join_timeout_s=60)
    q = CTX.Queue()
    proc = _start(_receiver, cfg, 2, q, False, 1)  # sync 0 bucketed, sync 1 per tensor
    model = Mixed(seed=0)
    model.perturb(1)
    try:
        with WeightBroadcaster(model, cfg, bucket_mb=0.001) as bc:
            bc.signal_drain()
            bc.signal_drain()  # idempotent: still one announced sync
            bucketed = bc.broadcast(1)
            _, blob_b, pending = _get(q)
            assert not pending
            # The benchmark's baseline plugs in through the Transport hook.
            per_tensor = bc.broadcast(2, transport=PER_TENSOR)
            version, blob_t, _ = _get(q)
        assert version == 2 and per_tensor.mode == "per_tensor"
        assert per_tensor.collectives == len(bc.layout.slots) > bucketed.collectives
        _assert_bitwise(model, blob_b)
        _assert_bitwise(model, blob_t)
    finally:
        _stop(proc)


@pytest.mark.multiproc
def test_receiver_dying_mid_broadcast_raises_within_timeout() -> None:
    cfg = SyncGroupConfig.local(timeout_s=4, join_timeout_s=60)
    proc = _start(_dying_receiver, cfg)
    bc = WeightBroadcaster(Mixed(seed=0), cfg, bucket_mb=0.001)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"dying-worker.*4 s timeout"):
        bc.broadcast(1)
    # Well under the 60 s join timeout: it is the 4 s collective timeout that fired. (A tight upper
    # bound would be a wall-clock window, flaky on a loaded machine.)
    assert time.monotonic() - t0 < 30
    with pytest.raises(WeightSyncError, match="broken"):  # no silent reuse of a broken group
        bc.broadcast(2)
    bc.close()
    _stop(proc)
    assert proc.exitcode == 3


@pytest.mark.multiproc
def test_stalled_receiver_times_out_instead_of_hanging() -> None:
    cfg = SyncGroupConfig.local(timeout_s=2, join_timeout_s=60)
    proc = _start(_stalled_receiver, cfg)
    try:
        bc = WeightBroadcaster(Mixed(seed=0), cfg, bucket_mb=0.001)
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"stalled-worker.*2 s timeout"):
            bc.broadcast(1)
        # It waited for the 2 s timeout (not an instant error) and not for the 60 s join timeout.
        assert 1.5 < time.monotonic() - t0 < 30
        bc.close()
    finally:
        proc.kill()
        proc.join()


@pytest.mark.multiproc
def test_layout_mismatch_is_refused_on_both_sides() -> None:
    cfg = SyncGroupConfig.local(timeout_s=10, join_timeout_s=60)
    q = CTX.Queue()
    proc = _start(_mismatched_receiver, cfg, q)
    try:
        with pytest.raises(WeightSyncError, match="layout mismatch.*odd-worker"):
            WeightBroadcaster(Mixed(seed=0), cfg, bucket_mb=0.001)
        assert "layout mismatch" in q.get(timeout=20)
    finally:
        _stop(proc)


@pytest.mark.multiproc
def test_direct_threshold_mismatch_is_refused() -> None:
    """Same module, different direct_mb: the plans differ, so the handshake refuses."""
    cfg = SyncGroupConfig.local(timeout_s=10, join_timeout_s=60)
    q = CTX.Queue()
    proc = _start(_mismatched_receiver, cfg, q, 24, 1.0)  # worker: everything packed
    try:
        with pytest.raises(WeightSyncError, match="layout mismatch.*odd-worker"):
            WeightBroadcaster(Mixed(seed=0), cfg, bucket_mb=0.001)  # trainer: Linear weights direct
        assert "layout mismatch" in q.get(timeout=20)
    finally:
        _stop(proc)


# ------------------------------------------------------------------------------ benchmark
def test_bench_cli_parses_gpu_and_size_flags() -> None:
    args = bench_sync.parse_args(["--sizes", "10M", "100M", "10M:128", "--reps", "3"])
    assert args.sizes == ["10M", "100M", "10M:128"] and args.device == "cpu"
    assert bench_sync.lead_ms(args, 50.0) == 60.0
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device"):
            bench_sync.parse_args(["--device", "cuda"])
    with pytest.raises(SystemExit, match="must be < --update-ms"):
        bench_sync.parse_args(["--drain-lead-ms", "500"])


@pytest.mark.multiproc
def test_bench_runs_every_method_tiny(tmp_path) -> None:
    out = bench_sync.main(["--sizes", "100K", "--reps", "1", "--drain-sizes", "100K", "--drain-reps", "2",
                           "--forward-ms", "5", "--update-ms", "30", "--out", str(tmp_path)])
    lat = out["rows"][0]["latency"]
    assert set(lat) == set(bench_sync.METHODS) and all(m["bit_exact"] for m in lat.values())
    assert out["rows"][0]["drain"][0]["served"]["syncs"] == 4
    assert "python -m benchmarks.sync --sizes 100K" in (tmp_path / "sync.md").read_text()
    assert (tmp_path / "sync.json").exists()
