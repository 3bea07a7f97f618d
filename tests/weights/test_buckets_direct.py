"""Large tensors broadcast directly, small ones packed (``direct_mb`` of the bucketed transport).

In-process: the plan puts the large tensors in direct slots and packs the rest, the signature
covers which slots are direct, ``direct_mb`` changes the plan. Multi-process (spawned receiver,
gloo): two versions arrive bit for bit, the worker's large parameters keep their storage (the
contiguous one is the broadcast's own target, the non-contiguous one is copied into in place),
and the transport's collective count is buckets + direct tensors.
"""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from fastlight.weights.broadcast import BUCKETED, SyncGroupConfig, WeightBroadcaster, WeightReceiver
from fastlight.weights.buckets import DIRECT, PackedWeights, plan_buckets, sync_entries

CTX = mp.get_context("spawn")
BUCKET_MB = 0.002  # 2,097-byte buckets; default direct_mb = BUCKET_MB / 4 -> 524 bytes
LARGE = ("big", "big_bf16", "big_t")


class LargeAndSmall(nn.Module):
    """Three large tensors (fp32, bf16, a non-contiguous fp32 transpose) and 70 small ones."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.big = nn.Parameter(torch.randn(32, 16))  # 2,048 bytes
        self.big_bf16 = nn.Parameter(torch.randn(20, 20).to(torch.bfloat16))  # 800 bytes
        self.big_t = nn.Parameter(torch.randn(16, 24).t())  # 1,536 bytes, non-contiguous
        self.small = nn.ParameterList([nn.Parameter(torch.randn(3, 5)) for _ in range(60)])  # 60 bytes
        self.small_bf16 = nn.ParameterList(nn.Parameter(torch.randn(7).to(torch.bfloat16)) for _ in range(10))

    def perturb(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype))


def _ptrs(model: nn.Module) -> dict[str, int]:
    return {k: v.data_ptr() for k, v in model.named_parameters()}


def _values(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in sync_entries(model)}


def _dump(model: nn.Module) -> bytes:  # bytes, not tensors: no fd sharing with an exiting process
    buf = io.BytesIO()
    torch.save(_values(model), buf)
    return buf.getvalue()


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    bits = [t.contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
    return a.dtype == b.dtype and torch.equal(*bits)


def _receiver(cfg: SyncGroupConfig, n_syncs: int, q) -> None:
    try:
        model = LargeAndSmall(seed=99)
        before = _ptrs(model)
        rx = WeightReceiver(model, cfg, bucket_mb=BUCKET_MB, name="direct-worker")
        for _ in range(n_syncs):
            deadline = time.monotonic() + 20
            while not rx.sync_pending():
                assert time.monotonic() < deadline, "no sync announced"
                time.sleep(0.002)
            version = rx.receive()
            q.put((version, _dump(model), _ptrs(model) == before, model.big_t.is_contiguous()))
        rx.close()
    except BaseException as exc:  # noqa: BLE001 -- report anything to the test
        q.put(("error", repr(exc), None, None))


# ------------------------------------------------------------------------------ in-process
def test_plan_sends_large_tensors_directly_and_packs_small_ones() -> None:
    model = LargeAndSmall(0)
    lay = plan_buckets(model, BUCKET_MB, direct_mb=BUCKET_MB / 4)
    direct = {lay.slots[i].name for i in lay.direct}
    assert direct == set(LARGE)
    assert all(lay.slots[i].bucket == DIRECT and lay.slots[i].direct for i in lay.direct)
    packed = [s for s in lay.slots if not s.direct]
    assert len(packed) == 70 and all(s.numel * 4 < BUCKET_MB / 4 * 2**20 for s in packed)
    # Buckets hold only packed slots; the small fp32 ones need two buckets of <= 2,097 bytes.
    in_buckets = {i for b in lay.buckets for i in b.slot_ids}
    assert in_buckets == {i for i, s in enumerate(lay.slots) if not s.direct}
    assert [b.dtype for b in lay.buckets] == [torch.float32, torch.float32, torch.bfloat16]
    assert lay.nbytes == sum(t.numel() * t.element_size() for _, t in sync_entries(model))
    assert BUCKETED.collectives(SimpleNamespace(layout=lay)) == len(lay.buckets) + len(LARGE)


class _RecordingGroup:
    """Stands in for the sync group: records which storage each broadcast reads or writes."""

    def __init__(self) -> None:
        self.targets: list[int] = []

    def bcast(self, tensor: torch.Tensor, src: int) -> SimpleNamespace:
        assert tensor.is_contiguous()
        self.targets.append(tensor.data_ptr())
        return SimpleNamespace(wait=lambda: None)


def _endpoint(model: nn.Module) -> SimpleNamespace:
    lay = plan_buckets(model, BUCKET_MB, direct_mb=BUCKET_MB / 4)
    return SimpleNamespace(layout=lay, packed=PackedWeights.alloc(lay), group=_RecordingGroup())


def test_direct_tensors_are_broadcast_from_and_into_the_live_tensors() -> None:
    """Trainer: the live contiguous tensors themselves are sent; worker: received into directly
    (the non-contiguous one goes through a temporary). Direct collectives come first, then buckets."""
    for side in ("send", "recv"):
        model = LargeAndSmall(0)
        ep = _endpoint(model)
        tensors = [t.detach() for _, t in sync_entries(model)]
        with torch.no_grad():
            getattr(BUCKETED, side)(ep, tensors)
        live = {k: v.data_ptr() for k, v in model.named_parameters()}
        direct, buckets = ep.group.targets[:3], ep.group.targets[3:]
        assert direct[:2] == [live["big"], live["big_bf16"]] and direct[2] != live["big_t"], side
        assert buckets == [b.data_ptr() for b in ep.packed.buckets], side
        assert len(ep.group.targets) == BUCKETED.collectives(ep), side


def test_direct_mb_changes_the_plan_and_the_signature() -> None:
    model = LargeAndSmall(0)
    packed_all = plan_buckets(model, BUCKET_MB)  # direct_mb=None: the double buffer's plan
    some = plan_buckets(model, BUCKET_MB, direct_mb=BUCKET_MB / 4)
    only_big = plan_buckets(model, BUCKET_MB, direct_mb=2048 / 2**20)
    assert packed_all.direct == () and len(some.direct) == 3
    assert [some.slots[i].name for i in only_big.direct] == ["big"]
    assert len({packed_all.signature, some.signature, only_big.signature}) == 3
    assert some.signature == plan_buckets(LargeAndSmall(5), BUCKET_MB, direct_mb=BUCKET_MB / 4).signature
    with pytest.raises(ValueError, match="direct_mb must be > 0"):
        plan_buckets(model, BUCKET_MB, direct_mb=0)


def test_pack_unpack_skip_direct_slots() -> None:
    src, dst = LargeAndSmall(1), LargeAndSmall(2)
    lay = plan_buckets(src, BUCKET_MB, direct_mb=BUCKET_MB / 4)
    packed = PackedWeights.alloc(lay)
    assert sum(b.numel() * b.element_size() for b in packed.buckets) == lay.nbytes - sum(
        lay.slots[i].numel * (2 if lay.slots[i].dtype == torch.bfloat16 else 4) for i in lay.direct)
    packed.pack([t for _, t in sync_entries(src)])
    packed.unpack([t for _, t in sync_entries(dst)])
    want, got = _values(src), _values(dst)
    for i, s in enumerate(lay.slots):  # packed slots copied; direct ones untouched by pack/unpack
        assert _bits_equal(want[s.name], got[s.name]) != (i in lay.direct), s.name


# ------------------------------------------------------------------------------ multi-process
@pytest.mark.multiproc
def test_direct_tensors_arrive_in_place_bit_for_bit() -> None:
    cfg = SyncGroupConfig.local(timeout_s=20, join_timeout_s=60)
    q = CTX.Queue()
    proc = CTX.Process(target=_receiver, args=(cfg, 2, q), daemon=True)
    proc.start()
    model = LargeAndSmall(seed=0)
    try:
        with WeightBroadcaster(model, cfg, bucket_mb=BUCKET_MB) as bc:
            lay = bc.layout
            assert {lay.slots[i].name for i in lay.direct} == set(LARGE) and len(lay.buckets) == 3
            for version in (3, 4):
                model.perturb(version)
                stats = bc.broadcast(version)
                got_version, blob, same_storage, big_t_contiguous = q.get(timeout=30)
                assert got_version == version, blob
                values = torch.load(io.BytesIO(blob), weights_only=True)
                want = _values(model)
                assert list(values) == list(want)
                assert all(_bits_equal(values[k], v) for k, v in want.items())
                # Every worker parameter keeps its storage: received in place, never rebound.
                assert same_storage and not big_t_contiguous
                assert stats.collectives == len(lay.buckets) + len(lay.direct) == 6
                assert stats.bytes == lay.nbytes
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_a_policy_without_parameters_publishes_its_version_only():
    """A fixed policy (a random baseline, a scripted expert) has nothing to sync: an empty layout,
    and shared memory still carries the version a sampler waits for."""
    import multiprocessing as mp

    from torch import nn

    from fastlight.weights.buckets import plan_buckets
    from fastlight.weights.shared_memory import SharedWeights

    fixed = nn.Module()
    layout = plan_buckets(fixed)
    assert layout.slots == () and layout.buckets == () and layout.nbytes == 0
    shared = SharedWeights(fixed, mp.get_context("spawn"))
    assert shared.version == -1
    shared.publish(fixed, 3)
    assert shared.load_into(nn.Module()) == 3
