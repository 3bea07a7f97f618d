"""Trainer -> sampler weights through one shared-memory buffer, tagged with a version.

The trainer writes what :func:`~fastlight.weights.buckets.sync_entries` publishes (trainable
parameters and floating buffers; frozen parameters came with the samplers' policy copy) into a
flat float32 tensor in shared memory and bumps ``version``; samplers copy it back in place before
a new round. One buffer, one lock, no pickling and no files on the hot path. It is both ends of the
path: a :class:`~fastlight.weights.publisher.WeightPublisher` for the trainer and a
:class:`~fastlight.weights.publisher.WeightSource` for the samplers.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import torch
from torch import nn

from fastlight.procs import OwnedLock
from fastlight.weights.buckets import sync_entries
from fastlight.weights.publisher import SyncStats


def _float_entries(module: nn.Module, names: tuple[str, ...]) -> list[tuple[str, torch.Tensor]]:
    """``module``'s published tensors; their names must be the ones the buffer was laid out for."""
    entries = sync_entries(module)
    if tuple(k for k, _ in entries) != names:
        mine = {k for k, _ in entries}
        raise ValueError(
            "SharedWeights: the published tensors changed since the buffer was laid out (a parameter's "
            f"requires_grad or the module changed): now also {sorted(mine - set(names))[:4]}, no longer "
            f"{sorted(set(names) - mine)[:4]}"
        )
    return entries


class SharedWeights:
    """A versioned, shared-memory copy of a module's floating-point state.

    ``version`` is -1 until the first ``publish``. Built in the trainer process and passed to
    spawned samplers as a ``Process`` argument (the buffer travels as a shared-memory handle).
    """

    def __init__(self, module: nn.Module, ctx: mp.context.BaseContext) -> None:
        entries = sync_entries(module)
        self.names = tuple(k for k, _ in entries)
        self.numel = sum(v.numel() for _, v in entries)
        self.buffer = torch.zeros(self.numel, dtype=torch.float32).share_memory_()
        self._version = ctx.Value("q", -1, lock=False)
        # Pid-tagged, so a sampler killed while copying the weights out cannot lock the trainer out.
        self._lock = OwnedLock(ctx)

    @property
    def version(self) -> int:
        return int(self._version.value)

    def publish(self, module: nn.Module, version: int) -> SyncStats:
        """Copy ``module``'s current weights in and make them visible as ``version``."""
        t0 = time.perf_counter()
        entries = _float_entries(module, self.names)
        with self._lock, torch.no_grad():
            offset = 0
            for _, v in entries:
                n = v.numel()
                self.buffer[offset : offset + n].copy_(v.detach().reshape(-1).to("cpu", torch.float32))
                offset += n
            if offset != self.numel:
                raise ValueError(
                    f"SharedWeights.publish: module has {offset} floats, buffer holds {self.numel}"
                )
            self._version.value = version
        latency_ms = 1000.0 * (time.perf_counter() - t0)
        nbytes = self.buffer.numel() * self.buffer.element_size()
        return SyncStats(version, "shared_memory", latency_ms, nbytes, len(entries), latency_ms)

    def request_drain(self) -> None:
        """Nothing to drain: samplers pick the new weights up between rounds."""

    def release_if_held_by(self, pid: int) -> bool:
        """Free the lock if the killed process ``pid`` held it (see :class:`OwnedLock`)."""
        return self._lock.release_if_held_by(pid)

    def load_into(self, module: nn.Module) -> int:
        """Copy the published weights into ``module`` in place; returns their version."""
        entries = _float_entries(module, self.names)
        with self._lock, torch.no_grad():
            offset = 0
            for _, v in entries:
                n = v.numel()
                v.copy_(self.buffer[offset : offset + n].view_as(v).to(v.dtype))
                offset += n
            return int(self._version.value)
