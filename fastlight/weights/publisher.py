"""The trainer -> sampler weight path, as two typed ends (AcceRL §weight sync).

- :class:`WeightPublisher` is the trainer's end: ``publish(policy, version)`` makes ``policy``'s
  current weights the samplers' ``version`` and returns :class:`SyncStats`; ``request_drain()``
  announces the next publish early (AcceRL §inference drain; a no-op where nothing is in flight).
- :class:`WeightSource` is a sampler's end: the newest published ``version`` and ``load_into``.

Implementations: :class:`~fastlight.weights.shared_memory.SharedWeights` (samplers hold policy
copies; one shared-memory buffer) and :class:`~fastlight.inference.client.InferenceClient`
(one inference worker holds the policy). The client publishes through
:class:`~fastlight.weights.double_buffer.SharedDoubleBuffer` for a CPU worker on this host (two
shared slots; one copy in, a pointer swap in the worker; ``mode == "shared_memory"``), the same
with its slots on the GPU for a CUDA worker on the trainer's GPU (CUDA IPC, ``mode == "cuda_ipc"``),
and through a two-rank broadcast group, :mod:`fastlight.weights.broadcast`, for a CUDA worker on
another GPU (``mode == "bucketed"``). A :class:`~fastlight.fleet.pool.SamplerPool` holds exactly
one publisher, and ``RolloutDataModule.publish`` is the one place that calls it.
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


@runtime_checkable
class WeightPublisher(Protocol):
    def publish(self, policy: nn.Module, version: int) -> SyncStats: ...

    def request_drain(self) -> None: ...


@runtime_checkable
class WeightSource(Protocol):
    @property
    def version(self) -> int: ...

    def load_into(self, policy: nn.Module) -> int: ...
