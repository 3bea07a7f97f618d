"""Trainer -> sampler weights through one set of shared-memory buckets, tagged with a version.

The trainer packs the published tensors into flat per-dtype buckets in shared memory (one copy) and
bumps ``version``; samplers unpack them in place before a new round (one copy). No pickling and no
files on the hot path. It is both ends of the path: the trainer's publisher and the samplers' source.
"""

from __future__ import annotations

import multiprocessing as mp
import time

from torch import nn

from fastlight.procs import OwnedLock
from fastlight.weights.buckets import ONE_BUCKET_PER_DTYPE_MB, PackedWeights, layout_tensors, plan_buckets
from fastlight.weights.publisher import SyncStats


class SharedWeights:
    """A versioned, shared-memory copy of a module's published tensors (``version`` -1 until the first
    ``publish``), built in the trainer and passed to spawned samplers as a ``Process`` argument."""

    def __init__(self, module: nn.Module, ctx: mp.context.BaseContext) -> None:
        self.packed = PackedWeights.alloc(plan_buckets(module, ONE_BUCKET_PER_DTYPE_MB), shared=True)
        self._version = ctx.Value("q", -1, lock=False)
        self._lock = OwnedLock(ctx)  # a sampler killed while copying out cannot lock the trainer out

    @property
    def version(self) -> int:
        return int(self._version.value)

    def publish(self, module: nn.Module, version: int) -> SyncStats:
        """Copy ``module``'s current weights in and make them visible as ``version``."""
        t0 = time.perf_counter()
        tensors = layout_tensors(module, self.packed.layout)
        with self._lock:
            self.packed.pack(tensors)
            self._version.value = version
        ms = 1000.0 * (time.perf_counter() - t0)
        return SyncStats(version, "shared_memory", ms, self.packed.layout.nbytes, len(tensors), ms)

    def request_drain(self) -> None:
        """Nothing to drain: samplers pick the new weights up between rounds."""

    def release_if_held_by(self, pid: int) -> bool:
        """Free the lock if the killed process ``pid`` held it (see :class:`OwnedLock`)."""
        return self._lock.release_if_held_by(pid)

    def load_into(self, module: nn.Module) -> int:
        """Copy the published weights into ``module`` in place; returns their version."""
        tensors = layout_tensors(module, self.packed.layout)
        with self._lock:
            self.packed.unpack(tensors)
            return int(self._version.value)
