"""Same-host trainer -> inference worker weights through two shared buffers, on the CPU or one GPU.

For a worker whose weights live on this host's CPU, a broadcast group is two extra copies through
loopback sockets. Here the weights live in shared memory instead: two *sets* of flat per-dtype
buffers (slot 0 and slot 1; the fixed order and layout of :mod:`fastlight.weights.buckets`, one
bucket per dtype), mapped by both processes.

``device`` says where the slots live. ``"cpu"`` (``SyncStats.mode == "shared_memory"``): host
shared memory. ``"cuda:N"`` (``mode == "cuda_ipc"``), for a worker on the GPU that holds the
trainer's weights, where NCCL cannot group the two processes and gloo would stage every sync through
host memory: the slots are CUDA tensors of the trainer's process. Passed to the spawned worker
with the buffer, ``torch.multiprocessing`` pickles them as CUDA IPC handles, which the worker opens
once, at start-up; every publish after that is one on-device copy into the free slot and a flip of
the version counter (vLLM's ``ipc`` weight transfer and SGLang's same-GPU update do the same: one
flat buffer per dtype, its handle shared once; opening handles per sync is the cost they avoid).
Both processes order their GPU work around the flip: the trainer waits for its copy to finish on
the device before it flips, the worker waits for its forwards on the old slot to finish before it
leaves that slot to the trainer.

- **Trainer** (:meth:`SharedDoubleBuffer.publish`): copies the policy once into the slot the
  worker does *not* use, then flips ``active`` to it, and (by default) waits for the worker's ack.
- **Worker** (:class:`DoubleBufferReader`, from :meth:`SharedDoubleBuffer.attach`): between two
  forward passes (``serve_until``'s sync step) it claims the active slot and points every
  published tensor (trainable parameter and floating buffer, :func:`~fastlight.weights.buckets.sync_entries`)
  at its view of that slot (``tensor.data = view``): a pointer swap, no copy. It then acks the
  version. After the first swap the worker's published weights *are* the slot; its frozen ones are
  those of the policy copy it started with.
- **No torn model**: the trainer never writes the slot the worker has claimed. The claim and the
  trainer's check happen under one lock; if the worker still holds the target slot the trainer
  waits (up to ``timeout_s``) and then raises :class:`~fastlight.weights.broadcast.WeightSyncError`
  naming the worker. The flip is published (under the lock, a memory barrier) only after the copy.
- **Drain** (AcceRL §inference drain): :meth:`SharedDoubleBuffer.request_drain` announces the next
  publish; the worker's :meth:`DoubleBufferReader.sync_pending` turns true, it finishes the forward
  in flight, schedules no new one and swaps as soon as the flip lands. Without a drain it swaps at
  the first gap between forwards after the flip. The trainer's copy never waits for the worker.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable

import torch
from torch import nn

from fastlight.weights.buckets import ONE_BUCKET_PER_DTYPE_MB, PackedWeights, layout_tensors, plan_buckets
from fastlight.weights.publisher import SyncStats, WeightSyncError

# Shared state: [0] active slot (-1: nothing published), [1] version in slot 0, [2] version in slot 1,
# [3] publishes announced (drain), [4] publishes flipped, [5] slot the worker claimed (-1: its own
# memory), [6] version the worker acked.
_ACTIVE, _V0, _ANNOUNCED, _FLIPPED, _CLAIMED, _ACKED = 0, 1, 3, 4, 5, 6


def slot_device(device: torch.device | str) -> torch.device:
    """Where :class:`SharedDoubleBuffer` puts its slots: ``cpu``, or a CUDA device with its index.
    A bare ``"cuda"`` is device 0, as in :func:`~fastlight.weights.group.choose_backend`: what a
    freshly spawned worker's ``"cuda"`` is, whatever device the trainer's process has selected."""
    d = torch.device(device)
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"SharedDoubleBuffer.device must be 'cpu' or 'cuda[:N]', got {str(d)!r}")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"SharedDoubleBuffer.device is {str(d)!r} but torch.cuda.is_available() is False")
    return torch.device("cuda", d.index or 0) if d.type == "cuda" else d


def _backoff_wait(ready: Callable[[], bool], timeout_s: float, check: Callable[[], None] | None) -> bool:
    """Poll ``ready`` with a 20 us .. 1 ms backoff; ``check`` (may raise) runs every ~50 ms."""
    deadline = time.monotonic() + timeout_s
    pause, next_check = 2e-5, time.monotonic() + 0.05
    while not ready():
        now = time.monotonic()
        if now > deadline:
            return False
        if check is not None and now > next_check:
            check()
            next_check = now + 0.05
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)
    return True


class SharedDoubleBuffer:
    """Trainer end (:class:`~fastlight.weights.publisher.WeightPublisher`) of the double buffer, and
    the shared state both ends use. Build it from the policy *before* the worker starts and pass it
    to the worker as a ``Process`` argument (buffers travel as shared-memory handles, or as CUDA IPC
    handles for a CUDA ``device``: the worker maps them once, there).

    ``device`` is where the slots live, and must be where the worker holds its weights: ``cpu``
    (host shared memory) or the worker's CUDA device (its weights' GPU is the trainer's own, see
    :func:`fastlight.inference.client.weight_path`). The trainer's policy may be anywhere: the
    publish copies across. ``timeout_s`` bounds every trainer wait for the worker; ``worker_name``
    names it in errors.
    """

    def __init__(self, module: nn.Module, ctx: mp.context.BaseContext, *, timeout_s: float = 60.0,
                 worker_name: str = "inference worker", device: torch.device | str = "cpu") -> None:
        if timeout_s <= 0:
            raise ValueError(f"SharedDoubleBuffer.timeout_s must be > 0, got {timeout_s}")
        self.device = slot_device(device)
        self.mode = "cuda_ipc" if self.device.type == "cuda" else "shared_memory"  # SyncStats.mode
        self.layout = plan_buckets(module, ONE_BUCKET_PER_DTYPE_MB)
        self.timeout_s, self.worker_name = timeout_s, worker_name
        # CUDA (vLLM ipc weight transfer): plain device allocations of this process; pickling the
        # buffer into the worker's Process arguments exports their IPC handles, once. This process
        # must (and does) keep them alive for as long as the worker uses them.
        cpu = self.device.type == "cpu"
        self.slots = [PackedWeights.alloc(self.layout, self.device, shared=cpu) for _ in range(2)]
        self.state = ctx.Array("q", [-1, -1, -1, 0, 0, -1, -1], lock=False)
        self.lock = ctx.Lock()

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes

    @property
    def label(self) -> str:
        """What errors call this path: ``shared-memory`` or ``CUDA IPC``."""
        return "CUDA IPC" if self.mode == "cuda_ipc" else "shared-memory"

    @property
    def acked_version(self) -> int:
        """The version the worker swapped to last (-1 before its first swap)."""
        return int(self.state[_ACKED])

    @property
    def claimed_slot(self) -> int:
        return int(self.state[_CLAIMED])

    def request_drain(self) -> None:
        """Announce the next publish: the worker stops scheduling forwards and waits for the flip."""
        with self.lock:
            if self.state[_ANNOUNCED] <= self.state[_FLIPPED]:
                self.state[_ANNOUNCED] = self.state[_FLIPPED] + 1

    def publish(self, module: nn.Module, version: int, *, wait: bool = True,
                check: Callable[[], None] | None = None) -> SyncStats:
        """Copy ``module``'s weights into the free slot, flip to it as ``version``; with ``wait``,
        return once the worker acked it. ``check`` (e.g. "is the worker alive?") may raise while
        waiting. Raises :class:`WeightSyncError` naming the worker after ``timeout_s``."""
        t0 = time.perf_counter()
        tensors = layout_tensors(module, self.layout)
        self.request_drain()
        with self.lock:
            active = int(self.state[_ACTIVE])
        target = 0 if active < 0 else 1 - active
        self._wait(lambda: self._free(target), check,
                   f"to leave slot {target} (it still serves from it) before version {version} is written")
        self.slots[target].pack(tensors)  # the one copy (across devices if the policy is elsewhere)
        if self.device.type == "cuda":
            # The copy was only queued on this process's stream; the worker's streams (another process)
            # know nothing of it. Finish it on the device before the flip, so that the worker never
            # swaps onto a half-written slot (the flip below is what tells it the slot is ready).
            torch.cuda.synchronize(self.device)
        with self.lock:  # the flip: after the copy, under the lock (a memory barrier for the worker)
            self.state[_V0 + target] = version
            self.state[_ACTIVE] = target
            self.state[_FLIPPED] += 1
        if wait:
            self._wait(lambda: self.acked_version == version, check, f"to ack version {version}")
        latency_ms = 1000.0 * (time.perf_counter() - t0)
        return SyncStats(version, self.mode, latency_ms, self.nbytes, 0, latency_ms)

    def _free(self, slot: int) -> bool:
        with self.lock:
            return int(self.state[_CLAIMED]) != slot

    def _wait(self, ready: Callable[[], bool], check: Callable[[], None] | None, what: str) -> None:
        if not _backoff_wait(ready, self.timeout_s, check):
            raise WeightSyncError(
                f"{self.label} weight sync: the {self.worker_name} did not answer within the "
                f"{self.timeout_s:g} s timeout: waited for it {what}; it acked version "
                f"{self.acked_version} and holds slot {self.claimed_slot}")

    def attach(self, module: nn.Module, *, name: str = "inference worker",
               stopped: Callable[[], bool] | None = None) -> DoubleBufferReader:
        """The worker end, for ``module`` (call in the worker process)."""
        return DoubleBufferReader(self, module, name=name, stopped=stopped)


class DoubleBufferReader:
    """Worker end: ``sync_pending`` / ``receive`` as :func:`~fastlight.inference.server.serve_until`
    expects, plus ``version``. ``receive`` swaps ``module``'s tensors to views of the active slot.

    While drained it waits for the flip for as long as the trainer lives (the worker dies with its
    trainer) or until ``stopped()``; then ``receive`` returns the version it already has.
    """

    def __init__(self, shared: SharedDoubleBuffer, module: nn.Module, *, name: str,
                 stopped: Callable[[], bool] | None) -> None:
        mine = plan_buckets(module, ONE_BUCKET_PER_DTYPE_MB)
        if mine.signature != shared.layout.signature:
            raise WeightSyncError(f"{shared.label} weight sync: {name}'s model layout does not match the "
                                  f"trainer's ({mine.nbytes} vs {shared.layout.nbytes} bytes)")
        for t in layout_tensors(module, mine):
            if t.device != shared.device:  # the pointer swap below moves no bytes across devices
                where = "CPU weights" if shared.device.type == "cpu" else f"weights on {shared.device}"
                raise WeightSyncError(f"{shared.label} weight sync needs {where}; {name} has {t.device}")
        self.shared, self.module, self.name, self.stopped = shared, module, name, stopped
        self.version = -1
        self.received = 0  # publishes flipped when this worker last swapped

    def sync_pending(self) -> bool:
        """True once the trainer announced (drain) or flipped a publish this worker has not taken."""
        return int(self.shared.state[_ANNOUNCED]) > self.received or \
            int(self.shared.state[_FLIPPED]) > self.received

    def receive(self, module: nn.Module | None = None) -> int:
        """Wait for the flip, claim the active slot and point the module's tensors at it (no copy)."""
        state = self.shared.state
        stopped = self.stopped or (lambda: False)
        _backoff_wait(lambda: int(state[_FLIPPED]) > self.received or stopped(), float("inf"), None)
        if int(state[_FLIPPED]) <= self.received:  # stopped while drained: nothing to take
            return self.version
        if self.shared.device.type == "cuda":
            # Forwards queued on this process's streams may still read the slot being left: finish
            # them before the claim below frees it to the trainer's next copy (no torn reads).
            torch.cuda.synchronize(self.shared.device)
        with self.shared.lock:  # the claim: the trainer will not write this slot until we leave it
            slot = int(state[_ACTIVE])
            version, self.received = int(state[_V0 + slot]), int(state[_FLIPPED])
            state[_CLAIMED] = slot
        target = module if module is not None else self.module
        views = self.shared.slots[slot].views
        for t, view in zip(layout_tensors(target, self.shared.layout), views, strict=True):
            t.data = view  # a pointer swap: the parameter object stays, its storage is the slot
        self.version = version
        state[_ACKED] = version
        return version
