"""Where a rank's samplers run: the two typed sides of ``--data.fleet``.

- :class:`Fleet` is the setting (``RolloutDataModule(fleet=...)``, ``--data.fleet.class_path``):
  :class:`~fastlight.fleet.pool.LocalFleet` (the default: processes of the trainer's machine) or
  :class:`~fastlight.fleet.ray.fleet.RayFleet` (Ray actors on any node of a cluster). Its one
  method, :meth:`Fleet.build`, makes the running fleet of one trainer rank.
- :class:`SamplerFleet` is what the DataModule drives, whichever fleet runs: start, publish a
  policy version, take the next Rollout (in completion order), push task weights, count faults,
  stop. :class:`~fastlight.fleet.pool.SamplerPool` and the Ray fleet implement it.

Both are abstract base classes, not duck types: a fleet that misspells or omits a method cannot be
instantiated (``TypeError`` naming it), instead of failing on the first call in the middle of a run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from fastlight.fleet.faults import FaultSettings
from fastlight.inference.settings import InferenceSettings
from fastlight.rollout import Rollout
from fastlight.sampling.worker import SamplerConfig
from fastlight.weights.publisher import SyncStats


class SamplerFleet(ABC):
    """The running samplers of one trainer rank, as the DataModule sees them.

    ``restarts`` and ``dropped_rollouts`` are the ``faults/worker_restarts`` and
    ``faults/dropped_rollouts`` counts of this fleet so far.
    """

    restarts: int
    dropped_rollouts: int

    @property
    @abstractmethod
    def num_workers(self) -> int:
        """Samplers: one Rollout item of each makes a training step's super-batch."""

    @abstractmethod
    def start(self) -> None:
        """Start every sampler (they wait for the first :meth:`publish`)."""

    @abstractmethod
    def publish(self, policy: nn.Module, version: int) -> SyncStats:
        """Make ``policy``'s weights the samplers' ``version``; they take them at their next round."""

    @abstractmethod
    def request_drain(self) -> None:
        """Announce the next :meth:`publish` (a no-op where nothing is served)."""

    @abstractmethod
    def next_item(self, timeout: float) -> Rollout | None:
        """The next Rollout any sampler finished, or None after ``timeout`` seconds without one.
        Restarts failed samplers within the budget; raises naming the sampler past it."""

    def cut_in_flight(self, timeout: float) -> list[Rollout]:
        """A training step's batch just completed: ask every sampler but the one whose item completed
        it to end its round at its next step, and return the Rollouts that arrive within ``timeout``
        seconds (``--data.cut_in_flight``, :mod:`fastlight.sampling.cut_requests`). A fleet that
        cannot ask returns none; the DataModule refuses the setting for it."""
        return []

    @abstractmethod
    def set_task_weights(self, weights: list[float]) -> None:
        """Task-sampling weights for every sampler's envs, applied before their next round (DWR)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every sampler; idempotent. Nothing is restarted once it has begun."""


class Fleet(ABC):
    """The ``--data.fleet`` setting: where a rank's samplers run.

    ``shared_memory``: whether its samplers run on the trainer's machine and can share memory with
    it and each other (``--data.truncation_scope auto`` then shares DPSA's termination rate).
    """

    shared_memory: bool = False

    @abstractmethod
    def build(
        self,
        configs: list[SamplerConfig],
        policy: nn.Module,
        *,
        rank: int,
        inference: InferenceSettings | None,
        trainer_device: torch.device | str,
        example_obs: Any,
        faults: FaultSettings,
        start_method: str,
    ) -> SamplerFleet:
        """The (not yet started) fleet of trainer rank ``rank``: one sampler per config, each acting
        with a copy of ``policy`` (or, with ``inference``, served by one inference worker)."""
