"""Shared-memory double buffer (same host, CPU worker): one copy in, a pointer swap out.

In-process (both ends in this process): the worker's tensors move into the shared slots (their
``data_ptr`` lands inside the slot, the parameter objects stay), the weights are bit-exact, the
trainer never writes the slot the worker holds (it raises naming the worker instead), a missing ack
raises within the timeout, and the drain signal is seen. Multi-process: a spawned worker receives
several versions of a mixed-dtype model bit for bit.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from fastlight.weights.broadcast import WeightSyncError
from fastlight.weights.buckets import layout_tensors, sync_entries
from fastlight.weights.double_buffer import SharedDoubleBuffer
from tests.weights.test_broadcast import Mixed, _assert_bitwise, _bits, _dump

CTX = mp.get_context("spawn")


def _inside(t: torch.Tensor, buf: torch.Tensor) -> bool:
    start = buf.data_ptr()
    return start <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= \
        start + buf.numel() * buf.element_size()


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
        assert torch.equal(_bits(want[k]), _bits(got[k])), k


def test_publish_is_one_copy_and_the_worker_swaps_pointers_not_bytes() -> None:
    trainer, worker = Mixed(seed=0), Mixed(seed=1)
    shared = SharedDoubleBuffer(trainer, CTX, timeout_s=5)
    dtypes = {torch.float32, torch.float64, torch.bfloat16, torch.float16}
    assert {b.dtype for b in shared.slots[0].buckets} == dtypes
    reader = shared.attach(worker, name="test worker")
    ids = [id(t) for t in layout_tensors(worker, shared.layout)]
    assert _slot_of(worker, shared) == {-1}  # its own memory before the first publish
    for version in range(4):
        trainer.perturb(seed=version)
        stats = shared.publish(trainer, version, wait=False)
        assert stats.mode == "shared_memory" and stats.bytes == shared.layout.nbytes
        assert reader.receive() == version
        assert _slot_of(worker, shared) == {version % 2}  # slots alternate: 0, 1, 0, 1
        assert [id(t) for t in layout_tensors(worker, shared.layout)] == ids  # same objects, new storage
        _assert_same_bits(trainer, worker)
        assert shared.acked_version == version and shared.claimed_slot == version % 2
    assert worker.inp.weight.is_shared()


def test_the_worker_keeps_a_whole_version_while_the_trainer_writes_the_other_slot() -> None:
    trainer, worker = Mixed(seed=0), Mixed(seed=1)
    shared = SharedDoubleBuffer(trainer, CTX, timeout_s=5)
    reader = shared.attach(worker, name="test worker")
    shared.publish(trainer, 0, wait=False)
    reader.receive()
    before = Mixed(seed=9)
    before.load_state_dict(worker.state_dict())
    trainer.perturb(seed=1)
    shared.publish(trainer, 1, wait=False)  # written and flipped; the worker has not swapped yet
    _assert_same_bits(before, worker)  # still exactly version 0: slot 1 was written, not slot 0
    assert reader.sync_pending()
    reader.receive()
    _assert_same_bits(trainer, worker)


def test_the_trainer_refuses_to_overwrite_the_slot_the_worker_holds() -> None:
    trainer, worker = Mixed(seed=0), Mixed(seed=1)
    shared = SharedDoubleBuffer(trainer, CTX, timeout_s=0.3, worker_name="slow worker (pid 42)")
    reader = shared.attach(worker, name="test worker")
    shared.publish(trainer, 0, wait=False)
    reader.receive()  # the worker holds slot 0
    shared.publish(trainer, 1, wait=False)  # slot 1, never taken
    held = [b.clone() for b in shared.slots[0].buckets]
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"slow worker \(pid 42\).*leave slot 0.*version 2"):
        shared.publish(trainer, 2, wait=False)
    assert time.monotonic() - t0 < 3
    assert all(torch.equal(a, b) for a, b in zip(held, shared.slots[0].buckets, strict=True))  # untouched


def test_publish_raises_naming_the_worker_when_it_never_acks() -> None:
    trainer = Mixed(seed=0)
    shared = SharedDoubleBuffer(trainer, CTX, timeout_s=0.3, worker_name="inference worker (pid 7)")
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"inference worker \(pid 7\).*0.3 s timeout.*ack version 0"):
        shared.publish(trainer, 0)
    assert time.monotonic() - t0 < 3


def test_publish_stops_at_once_when_the_liveness_check_fails() -> None:
    shared = SharedDoubleBuffer(Mixed(seed=0), CTX, timeout_s=30)

    def dead() -> None:
        raise RuntimeError("inference worker (pid 7) died with exit code -9")

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="died with exit code -9"):
        shared.publish(Mixed(seed=0), 0, check=dead)
    assert time.monotonic() - t0 < 5


def test_drain_is_announced_once_per_publish_and_a_stop_ends_the_wait() -> None:
    trainer, worker = Mixed(seed=0), Mixed(seed=1)
    shared = SharedDoubleBuffer(trainer, CTX, timeout_s=5)
    stop = {"now": False}
    reader = shared.attach(worker, name="test worker", stopped=lambda: stop["now"])
    assert not reader.sync_pending()
    shared.request_drain()
    shared.request_drain()  # idempotent until the publish
    assert reader.sync_pending()
    shared.publish(trainer, 0, wait=False)
    assert reader.receive() == 0 and not reader.sync_pending()
    shared.request_drain()
    stop["now"] = True  # drained, the trainer stops without publishing: the wait ends, nothing swaps
    assert reader.receive() == 0 and _slot_of(worker, shared) == {0}


def test_a_different_model_layout_is_refused() -> None:
    shared = SharedDoubleBuffer(Mixed(seed=0), CTX)
    with pytest.raises(WeightSyncError, match="odd worker's model layout does not match"):
        shared.attach(Mixed(seed=0, width=25), name="odd worker")


def _worker(shared: SharedDoubleBuffer, n: int, q) -> None:
    try:
        model = Mixed(seed=123)
        reader = shared.attach(model, name="spawned worker")
        for _ in range(n):
            while not reader.sync_pending():
                time.sleep(0.001)
            version = reader.receive()
            q.put((version, _dump(model)))  # bytes: the worker may exit before the test reads
    except BaseException as exc:  # noqa: BLE001 -- report anything to the test
        q.put(("error", repr(exc)))


@pytest.mark.multiproc
def test_a_spawned_worker_gets_every_version_bit_for_bit() -> None:
    trainer = Mixed(seed=0)
    shared = SharedDoubleBuffer(trainer, CTX, timeout_s=20, worker_name="spawned worker")
    q = CTX.Queue()
    proc = CTX.Process(target=_worker, args=(shared, 3, q), daemon=True)
    proc.start()
    try:
        for version in (5, 6, 7):
            trainer.perturb(seed=version)
            stats = shared.publish(trainer, version)  # returns once the worker acked
            assert stats.version == version and shared.acked_version == version
            got_version, got = q.get(timeout=20)
            assert got_version == version, got
            _assert_bitwise(trainer, got)
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join()
