"""Typed contracts between a run's parts, so a missing piece fails loudly instead of doing nothing.

- What callbacks need of the run's DataModule: :class:`TaskWeightSink` (DWR pushes task weights),
  :class:`WeightPublishing` (``WeightSync`` asks for a drain and reads the last :class:`SyncStats`).
- What the DataModule and ``WeightSync`` need of the LightningModule: :class:`TrainsPolicy`.

``require(...)`` checks one of them when the run starts and raises a ``TypeError`` naming both classes.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import nn

from fastlight.weights.publisher import SyncStats


@runtime_checkable
class TaskWeightSink(Protocol):
    def set_task_weights(self, weights: list[float]) -> None: ...


@runtime_checkable
class WeightPublishing(Protocol):
    def request_drain(self) -> None: ...

    @property
    def last_sync(self) -> SyncStats | None: ...


@runtime_checkable
class ReportsFaults(Protocol):
    """A DataModule that counts the faults it recovered from (``faults/*`` totals)."""

    def fault_counters(self) -> dict[str, float]: ...


@runtime_checkable
class ChecksEnvSpec(Protocol):
    """A module that refuses an env it cannot act in (sizes, action kind, observation keys)."""

    def check_env_spec(self, spec: object) -> None: ...


@runtime_checkable
class TrainsPolicy(Protocol):
    """A module whose ``policy`` the samplers copy, versioned by ``policy_version`` (bumped once per
    update of ``optimizer_steps_per_update`` optimizer steps)."""

    policy: nn.Module
    policy_version: int
    optimizer_steps_per_update: int


def require(obj: object, protocol: type, *, who: str, what: str) -> None:
    """Raise ``TypeError`` unless ``obj`` implements ``protocol`` (``who`` needs it, as ``what``)."""
    if isinstance(obj, protocol):
        return
    members = vars(protocol)
    names = [n for n in members if not n.startswith("_")] + list(members.get("__annotations__", {}))
    missing = sorted({n for n in names if not hasattr(obj, n)})
    got = "no DataModule (trainer.datamodule is None)" if obj is None else type(obj).__name__
    raise TypeError(
        f"{who} needs {what} implementing fastlight.data.protocols.{protocol.__name__}; the run has "
        f"{got}" + (f", which lacks {', '.join(missing)}" if obj is not None and missing else "")
    )
