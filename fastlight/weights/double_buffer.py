"""Same-host trainer -> inference worker weights through two shared buffers, on the CPU or one GPU.

Two *sets* (slots) of flat per-dtype buffers (:mod:`fastlight.weights.buckets`), mapped by both
processes: host shared memory (``"cpu"``, ``mode == "shared_memory"``), or CUDA tensors of the
trainer's process (``"cuda:N"``, ``mode == "cuda_ipc"``) for a worker on the trainer's GPU, where
NCCL cannot group the two processes; their CUDA IPC handles are opened once by the worker (as vLLM's
``ipc`` weight transfer does). Every publish is one copy into the free slot and a flip.

- **Trainer** (:meth:`SharedDoubleBuffer.publish`): copies the policy into the slot the worker does
  *not* use, flips ``active`` to it, and (by default) waits for the worker's ack.
- **Worker** (:class:`DoubleBufferReader`): between two forward passes it claims the active slot and
  points every published tensor at its view of that slot (``tensor.data = view``): a pointer swap,
  no copy; then acks the version.
- **No torn model**: the trainer never writes the slot the worker has claimed (claim and check under
  one lock; past ``timeout_s`` a :class:`~fastlight.weights.publisher.WeightSyncError` names the
  worker). The flip is published only after the copy, on a GPU only after the copy finished there.
- **Drain** (AcceRL §inference drain): :meth:`SharedDoubleBuffer.request_drain` announces the next
  publish; the worker finishes the forward in flight and swaps as soon as the flip lands.
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
    """Where :class:`SharedDoubleBuffer` puts its slots: ``cpu``, or a CUDA device with its index (a
    bare ``"cuda"`` is device 0, what a freshly spawned worker's ``"cuda"`` is)."""
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
    """Trainer end of the double buffer, and the shared state both ends use: build it from the policy
    *before* the worker starts and pass it to the worker as a ``Process`` argument. ``device``: where the
    slots live, where the worker holds its weights (the trainer's policy may be anywhere); ``timeout_s``
    bounds every trainer wait for the worker, ``worker_name`` names it."""

    def __init__(
        self,
        module: nn.Module,
        ctx: mp.context.BaseContext,
        *,
        timeout_s: float = 60.0,
        worker_name: str = "inference worker",
        device: torch.device | str = "cpu",
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"SharedDoubleBuffer.timeout_s must be > 0, got {timeout_s}")
        self.device = slot_device(device)
        self.mode = "cuda_ipc" if self.device.type == "cuda" else "shared_memory"  # SyncStats.mode
        self.layout = plan_buckets(module, ONE_BUCKET_PER_DTYPE_MB)
        self.timeout_s, self.worker_name = timeout_s, worker_name
        # CUDA: this process's allocations, kept alive here; pickling exports their IPC handles.
        shared = self.device.type == "cpu"
        self.slots = [PackedWeights.alloc(self.layout, self.device, shared=shared) for _ in range(2)]
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

    def publish(
        self, module: nn.Module, version: int, *, wait: bool = True, check: Callable[[], None] | None = None
    ) -> SyncStats:
        """Copy ``module``'s weights into the free slot, flip to it as ``version``; with ``wait``,
        return once the worker acked it. ``check`` (e.g. "is the worker alive?") may raise while
        waiting. Raises :class:`WeightSyncError` naming the worker after ``timeout_s``."""
        t0 = time.perf_counter()
        tensors = layout_tensors(module, self.layout)
        self.request_drain()
        with self.lock:
            active = int(self.state[_ACTIVE])
        target = 0 if active < 0 else 1 - active
        what = f"to leave slot {target} (it still serves from it) before version {version} is written"
        self._wait(lambda: self._free(target), check, what)
        self.slots[target].pack(tensors)  # the one copy (across devices if the policy is elsewhere)
        if self.device.type == "cuda":  # the copy was only queued on this process's stream: finish it
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
                f"{self.acked_version} and holds slot {self.claimed_slot}"
            )

    def attach(
        self, module: nn.Module, *, name: str = "inference worker", stopped: Callable[[], bool] | None = None
    ) -> DoubleBufferReader:
        """The worker end, for ``module`` (call in the worker process)."""
        return DoubleBufferReader(self, module, name=name, stopped=stopped)


class DoubleBufferReader:
    """Worker end (:func:`~fastlight.inference.server.serve_until`'s ``sync_pending`` / ``receive``).
    While drained it waits for the flip until ``stopped()``; then ``receive`` returns the version it
    already has."""

    def __init__(
        self, shared: SharedDoubleBuffer, module: nn.Module, *, name: str, stopped: Callable[[], bool] | None
    ) -> None:
        mine = plan_buckets(module, ONE_BUCKET_PER_DTYPE_MB)
        if mine.signature != shared.layout.signature:
            raise WeightSyncError(
                f"{shared.label} weight sync: {name}'s model layout does not match the "
                f"trainer's ({mine.nbytes} vs {shared.layout.nbytes} bytes)"
            )
        for t in layout_tensors(module, mine):
            if t.device != shared.device:  # the pointer swap below moves no bytes across devices
                where = "CPU weights" if shared.device.type == "cpu" else f"weights on {shared.device}"
                raise WeightSyncError(f"{shared.label} weight sync needs {where}; {name} has {t.device}")
        self.shared, self.module, self.name, self.stopped = shared, module, name, stopped
        self.version = -1
        self.received = 0  # publishes flipped when this worker last swapped

    def sync_pending(self) -> bool:
        """True once the trainer announced (drain) or flipped a publish this worker has not taken."""
        return max(int(self.shared.state[_ANNOUNCED]), int(self.shared.state[_FLIPPED])) > self.received

    def receive(self, module: nn.Module | None = None) -> int:
        """Wait for the flip, claim the active slot and point the module's tensors at it (no copy)."""
        state = self.shared.state
        stopped = self.stopped or (lambda: False)
        _backoff_wait(lambda: int(state[_FLIPPED]) > self.received or stopped(), float("inf"), None)
        if int(state[_FLIPPED]) <= self.received:  # stopped while drained: nothing to take
            return self.version
        if self.shared.device.type == "cuda":  # queued forwards may still read the slot being left
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
