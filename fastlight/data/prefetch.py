"""Background prefetcher: super-batches are assembled off the training step's critical path.

AcceRL §prefetch: a producer thread inside the trainer stacks ``rollouts_per_step`` sampler items
into a super-batch, keeping up to ``depth`` ready; the training step's wait is ``perf/data_wait_ms``.
With ``cut_in_flight`` a completed batch also takes the other samplers' rounds, cut at their next
step (:mod:`fastlight.sampling.round_signal`). Staleness is checked twice, both drops counted: when
an item arrives, and when a ready batch is taken (the trainer may have updated meanwhile).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from fastlight.rollout import Rollout

NextItem = Callable[[float], Rollout | None]
#: ``cut_in_flight(timeout)``: the rounds in flight, cut for the batch just completed.
CutInFlight = Callable[[float], list[Rollout]]
#: How long a completed batch waits for the rounds it asked to be cut (a later one joins the next batch).
CUT_WAIT_S = 2.0


class Prefetcher:
    """Producer thread over ``next_item(timeout) -> Rollout | None`` (None = nothing yet).

    Args:
        next_item: returns one sampler item or None after ``timeout``; raises if a sampler failed.
        version: returns the trainer's current policy version (read from the thread).
        items_per_batch: sampler items per super-batch (``rollouts_per_step``).
        max_staleness: drop data more than this many versions old.
        depth: ready super-batches kept (``prefetch``).
        cut_in_flight: called once a batch is complete; the cut rounds it returns join the batch.
    """

    def __init__(
        self,
        next_item: NextItem,
        version: Callable[[], int],
        *,
        items_per_batch: int,
        max_staleness: int,
        depth: int = 2,
        cut_in_flight: CutInFlight | None = None,
    ) -> None:
        self.next_item = next_item
        self.cut_in_flight = cut_in_flight
        self.version = version
        self.items_per_batch = items_per_batch
        self.max_staleness = max_staleness
        self.ready: queue.Queue[Rollout] = queue.Queue(maxsize=max(1, depth))
        self.dropped = 0
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fastlight-prefetch")

    def start(self) -> Prefetcher:
        self._thread.start()
        return self

    def _stale(self, rollout: Rollout) -> bool:
        versions = rollout.policy_version[rollout.valid]
        return bool(versions.numel()) and self.version() - int(versions.min()) > self.max_staleness

    def _fresh(self, items: list[Rollout]) -> list[Rollout]:
        """``items`` less the stale ones, which are counted as dropped."""
        fresh = [r for r in items if not self._stale(r)]
        self.dropped += len(items) - len(fresh)
        return fresh

    def _run(self) -> None:
        try:
            items: list[Rollout] = []
            while not self._stop.is_set():
                item = self.next_item(0.2)
                items += self._fresh([item] if item is not None else [])
                if len(items) < self.items_per_batch:
                    continue
                if self.cut_in_flight is not None:
                    items += self._fresh(self.cut_in_flight(CUT_WAIT_S))
                # By sampler, not by arrival: the same rounds make the same batch (exact resume).
                batch = Rollout.cat(sorted(items, key=lambda r: r.stats.sampler))
                items = []
                while not self._stop.is_set():
                    try:
                        self.ready.put(batch, timeout=0.2)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # surfaced to the training step by get()
            self._error = e

    def get(self, timeout: float) -> Rollout:
        """The next fresh super-batch; ``stats.data_wait_s`` and ``stats.dropped_stale`` are set."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        while True:
            if self._error is not None:
                raise self._error
            try:
                batch = self.ready.get(timeout=0.1)
            except queue.Empty:
                if time.monotonic() > deadline:
                    flag = "--data.faults.worker_timeout_s"
                    raise TimeoutError(f"no rollout for {timeout:.0f} s ({flag})") from None
                continue
            if self._stale(batch):
                self.dropped += 1
                continue
            batch.stats.data_wait_s = time.perf_counter() - t0
            batch.stats.dropped_stale, self.dropped = self.dropped, 0
            return batch

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
