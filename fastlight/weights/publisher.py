"""The trainer -> sampler weight path, as two typed ends (AcceRL §weight sync).

- :class:`WeightPublisher` is the trainer's end: ``publish(policy, version)`` makes ``policy``'s
  current weights the samplers' ``version`` and returns :class:`SyncStats`; ``request_drain()``
  announces the next publish early (AcceRL §inference drain; a no-op where nothing is in flight).
- :class:`WeightSource` is a sampler's end: the newest published ``version`` and ``load_into``.

Implementations: :class:`~fastlight.weights.shared_memory.SharedWeights` (samplers hold policy
copies; one shared-memory set of buckets) and :class:`~fastlight.inference.client.InferenceClient`
(one inference worker holds the policy; :func:`~fastlight.inference.client.weight_path` picks the
double buffer, ``mode`` ``shared_memory`` or ``cuda_ipc``, or the broadcast, ``bucketed``). The Ray
fleet puts each version in the object store (:mod:`fastlight.fleet.ray.sampler_actor`,
``mode == "ray_object_store"``) or broadcasts it to its inference actor. Every one of them packs and
unpacks with :mod:`fastlight.weights.buckets` (one fixed order, flat per-dtype buckets,
:class:`~fastlight.weights.buckets.PackedWeights`). A fleet holds exactly one publisher, and
``RolloutDataModule.publish`` is the one place that calls it.

**The one other place weights travel: the policy copy at spawn.** A sampler (and an inference
worker) is started with the whole policy module pickled into its process arguments, at start and at
every restart. That copy is what carries the *frozen* parameters (a LoRA run's base weights, a
frozen vision tower): :func:`~fastlight.weights.buckets.sync_entries` leaves them out of every
publish because they never change. Its trainable tensors are the values when the fleet was built,
and they never act: a sampler's loop takes no round before the first ``publish`` (``version >= 0``)
and loads the newest published version before it, a restarted one included (an inference worker
serves nothing before its first sync). Sending the architecture alone would need a second path for
the frozen weights; the copy at spawn is that path.
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
