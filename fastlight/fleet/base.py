"""Where a rank's samplers run: the two typed sides of ``--data.fleet``, and the watch every fleet shares.

- :class:`Fleet` is the setting (``--data.fleet.class_path``): :class:`~fastlight.fleet.pool.LocalFleet`
  (the default) or :class:`~fastlight.fleet.ray.fleet.RayFleet`; :meth:`Fleet.build` makes the
  running fleet of one trainer rank.
- :class:`SamplerFleet` is what the DataModule drives, whichever fleet runs, and keeps the fault
  bookkeeping every fleet shares (Sample Factory's habit: a dead or silent sampler is restarted on the
  current weights within a budget, :class:`~fastlight.fleet.faults.FaultSettings`). A fleet implements
  only its transport: how its samplers start, hand over Rollouts, are watched and stop.
"""

from __future__ import annotations

import atexit
import collections
import threading
import time
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fastlight.fleet.faults import FLAG, FaultSettings, SamplerError, spend_restart
from fastlight.inference.settings import InferenceSettings
from fastlight.models.base import check_policy
from fastlight.procs import HeartbeatLimits
from fastlight.rollout import Rollout
from fastlight.sampling.bundle import SamplerConfig
from fastlight.weights.publisher import SyncStats

#: How often (seconds) ``next_item`` looks for dead and silent samplers.
WATCH_EVERY_S = 0.25
#: How long ``stop`` waits for a restart under way (a spawn, an actor being placed) to finish.
RESTART_WAIT_S = 30.0


@dataclass(frozen=True)
class FleetBuild:
    """What one trainer rank's fleet is built from (:meth:`Fleet.build`): one sampler per config, each
    acting with a copy of ``policy`` or, with ``inference``, served by one inference worker on
    ``inference.device`` (``None``: ``trainer_device``; ``example_obs`` gives the observation layout).
    ``faults`` are the restart budget and heartbeat limits, ``start_method`` how local processes start."""

    configs: list[SamplerConfig]
    policy: nn.Module
    rank: int = 0
    inference: InferenceSettings | None = None
    trainer_device: torch.device | str = "cpu"
    example_obs: Any = None
    faults: FaultSettings = field(default_factory=FaultSettings)
    start_method: str = "spawn"


class SamplerFleet(ABC):
    """The running samplers of one trainer rank, as the DataModule sees them, and their faults:
    ``restarts`` and ``dropped_rollouts`` (``faults/*``) so far; ``stopping`` once :meth:`stop` began."""

    #: What the no-rollout error calls this fleet's samplers.
    samplers_name = "samplers"

    def __init__(self, build: FleetBuild) -> None:
        check_policy(build.policy)  # a missing action_mapping must fail here, not in a sampler
        self.build, self.configs, self.policy = build, build.configs, build.policy
        self.faults = faults = build.faults
        self.heartbeat_limits = HeartbeatLimits(
            faults.heartbeat_s, faults.worker_timeout_s, f"{FLAG}.heartbeat_s", f"{FLAG}.worker_timeout_s"
        )
        self.restarts = self.dropped_rollouts = 0
        self.stopping = False
        self._restart_times: collections.deque[float] = collections.deque()
        # Serialises a restart (the prefetch thread's watch) with a publish and with the stop.
        self._lock = threading.RLock()
        self._last_item = time.monotonic()
        self._last_watch = 0.0

    @property
    def num_workers(self) -> int:
        """Samplers: one Rollout item of each makes a training step's super-batch."""
        return len(self.configs)

    # ---------------------------------------------------------------- what the DataModule calls
    def start(self) -> None:
        """Start every sampler (they wait for the first :meth:`publish`)."""
        self._start()
        self._last_item = time.monotonic()
        atexit.register(_stop_ref, weakref.ref(self))  # last line of defence: an exit without teardown

    @abstractmethod
    def publish(self, policy: nn.Module, version: int) -> SyncStats:
        """Make ``policy``'s weights the samplers' ``version``; they take them at their next round."""

    @abstractmethod
    def request_drain(self) -> None:
        """Announce the next :meth:`publish` (a no-op where nothing is served)."""

    def next_item(self, timeout: float) -> Rollout | None:
        """The next Rollout any sampler finished, or None after ``timeout`` seconds without one.
        Restarts dead and silent samplers on the way; raises :class:`~fastlight.fleet.faults.SamplerError`
        past the budget, on a sampler's exception, and when no Rollout arrived for ``worker_timeout_s``."""
        self.watch()
        if (item := self._receive(timeout)) is not None:
            self._last_item = time.monotonic()
            return item
        self.watch(force=True)
        silent, timeout_s = time.monotonic() - self._last_item, self.faults.worker_timeout_s
        if silent > timeout_s and not self.stopping:
            raise SamplerError(
                f"no rollout from the {self.samplers_name} for {timeout_s:.0f} s "
                f"({FLAG}.worker_timeout_s); {self._describe()}"
            )
        return None

    def cut_in_flight(self, timeout: float) -> list[Rollout]:
        """A training step's batch just completed: ask the other samplers to end their rounds, and
        return the Rollouts that arrive within ``timeout`` seconds (:mod:`fastlight.sampling.round_signal`).
        A fleet that cannot ask returns none."""
        return []

    @abstractmethod
    def set_task_weights(self, weights: list[float]) -> None:
        """Task-sampling weights for every sampler's envs, applied before their next round (DWR)."""

    def stop(self) -> None:
        """Stop every sampler; idempotent. No restart begins once it is called; one under way is
        waited for, at most ``RESTART_WAIT_S``, and what it started stopped."""
        self.stopping = True
        locked = self._lock.acquire(timeout=RESTART_WAIT_S)
        try:
            self._stop()
        finally:
            if locked:
                self._lock.release()

    # ---------------------------------------------------------------- the shared watch
    def watch(self, force: bool = False) -> None:
        """Look for dead and silent samplers (at most every ``WATCH_EVERY_S`` unless ``force``), and
        restart them within the budget; nothing once the stop has begun."""
        now = time.monotonic()
        if not force and now - self._last_watch < WATCH_EVERY_S:
            return
        self._last_watch = now
        with self._lock:
            if not self.stopping:
                self._watch(now)

    def _spend_restart(self, name: str, action: str, note: str | None = None, *, dropped: int) -> bool:
        """One restart from the budget (:func:`~fastlight.fleet.faults.spend_restart`) for a fault that
        loses ``dropped`` rounds in flight. False, taking nothing, once the fleet is stopping."""
        if self.stopping:
            return False
        spend_restart(self._restart_times, max_restarts=self.faults.max_worker_restarts,
                      window_s=self.faults.restart_window_s, name=name, action=action, note=note)  # fmt: skip
        self.restarts += 1
        self.dropped_rollouts += dropped
        return True

    # ---------------------------------------------------------------- what a fleet implements
    @abstractmethod
    def _start(self) -> None:
        """Start every sampler."""

    @abstractmethod
    def _receive(self, timeout: float) -> Rollout | None:
        """A Rollout a sampler finished, or None (none within ``timeout`` seconds, or a heartbeat)."""

    @abstractmethod
    def _watch(self, now: float) -> None:
        """Restart (:meth:`_spend_restart`) or raise on every dead or silent sampler. Called under
        the lock, never once stopping."""

    @abstractmethod
    def _describe(self) -> str:
        """The samplers' state, for the no-rollout error."""

    @abstractmethod
    def _stop(self) -> None:
        """Stop every sampler (under the lock, with ``stopping`` set)."""


class Fleet(ABC):
    """The ``--data.fleet`` setting. ``shared_memory``: whether its samplers can share memory with the
    trainer and each other (``--data.rank_rounds auto`` then ends their rounds together)."""

    shared_memory: bool = False

    @abstractmethod
    def build(self, build: FleetBuild) -> SamplerFleet:
        """The (not yet started) fleet of trainer rank ``build.rank``."""


def _stop_ref(ref: weakref.ref) -> None:
    if (fleet := ref()) is not None:
        fleet.stop()
