"""The trainer -> sampler weight path, as two typed ends (AcceRL §weight sync).

- :class:`WeightPublisher` is the trainer's end: ``publish(policy, version)`` makes ``policy``'s
  current weights the samplers' ``version`` and returns :class:`SyncStats`; ``request_drain()``
  announces the next publish early (AcceRL §inference drain; a no-op where nothing is in flight).
- :class:`WeightSource` is a sampler's end: the newest published ``version`` and ``load_into``.

Implementations: :class:`~fastlight.weights.shared_memory.SharedWeights` (samplers hold policy copies),
:class:`~fastlight.inference.client.InferenceClient` (one inference worker holds the policy) and the
Ray fleet's object store; every one packs with :mod:`fastlight.weights.buckets`. A fleet holds exactly
one publisher, and ``RolloutDataModule.publish`` is the one place that calls it.

**The one other place weights travel: the policy copy at spawn.** A sampler (and an inference worker)
is started with the whole policy pickled into its process arguments, at start and at every restart.
That copy carries the *frozen* parameters, which no publish sends; its trainable tensors never act:
no round (or forward) runs before the first ``publish`` has been loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import nn


@dataclass(frozen=True)
class SyncStats:
    """One publish as the trainer saw it: ``latency_ms`` runs from the first byte sent to the
    moment the new weights are visible to the samplers (the worker's ack for a broadcast);
    ``trainer_wait_ms`` is how long ``publish`` blocked the trainer, waiting for a drain included."""

    version: int
    mode: str
    latency_ms: float
    bytes: int
    collectives: int
    trainer_wait_ms: float = 0.0

    def metrics(self) -> dict[str, float]:
        return {"sync/latency_ms": self.latency_ms, "sync/trainer_wait_ms": self.trainer_wait_ms,
                "sync/bytes": float(self.bytes), "sync/collectives": float(self.collectives),
                "sync/version": float(self.version)}  # fmt: skip


class WeightSyncError(RuntimeError):
    """A weight path's peer died, stalled past the timeout, disagrees on the model layout, or holds
    other weights than the trainer published (:class:`~fastlight.weights.checksum.DeliveryCheck`)."""


@runtime_checkable
class WeightPublisher(Protocol):
    def publish(self, policy: nn.Module, version: int) -> SyncStats: ...

    def request_drain(self) -> None: ...


@runtime_checkable
class WeightSource(Protocol):
    @property
    def version(self) -> int: ...

    def load_into(self, policy: nn.Module) -> int: ...
