"""Typed contracts between a run's parts, so a missing piece fails loudly instead of doing nothing.

What each part needs of the others (all ``runtime_checkable``; checked with ``isinstance``):

===========================================  ====================================================
needs                                        protocol
===========================================  ====================================================
``RolloutDataModule`` of the LightningModule :class:`RolloutPolicyModule`: ``policy`` (an
                                             ``nn.Module`` implementing
                                             :class:`fastlight.models.base.Policy`) and
                                             ``policy_version`` (+1 after every update)
``WeightSync`` of the LightningModule        :class:`TrainsPolicy`: the above and
                                             ``optimizer_steps_per_update``
``WeightSync`` of the DataModule             :class:`WeightPublishing`: ``request_drain``,
                                             ``last_sync``; ``sync/verified`` where it is
                                             also :class:`ChecksDelivery` (``delivery``)
``DynamicWeightedResampling`` of the         :class:`TaskWeightSink` (``set_task_weights``);
DataModule                                   its task count from :class:`MultiTaskData`
                                             (``task_names``) unless given
``RolloutThroughput`` of the batches         a :class:`~fastlight.rollout.Rollout`, or its
                                             ``batch_counts_fn`` (:data:`BatchCountsFn`)
``PreemptionCheckpoint`` of the DataModule   :class:`StopsSampling` (``stop``), where it has
                                             samplers to end before the stop checkpoint
``PeriodicEvaluation`` of the DataModule     :class:`EvaluationEnv` (``evaluation_env``), unless
                                             the callback is given ``env_id``
===========================================  ====================================================

``require(...)`` checks one of them when the run starts and raises a ``TypeError`` naming both
classes and the members that are missing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from torch import nn
from typing_extensions import get_protocol_members

from fastlight.rollout import RolloutStats
from fastlight.sampling.task_weights import TaskWeightedEnv
from fastlight.weights.checksum import DeliveryCheck
from fastlight.weights.publisher import SyncStats

#: ``batch -> RolloutStats`` for a training batch that is not a Rollout (``RolloutThroughput``),
#: like Lightning's ``batch_size`` hint. A ratio over a counter left at 0 is not logged.
BatchCountsFn = Callable[[Any], RolloutStats]


@runtime_checkable
class TaskWeightSink(Protocol):
    def set_task_weights(self, weights: list[float]) -> None: ...


@runtime_checkable
class GroupsEnvs(Protocol):
    """A DataModule whose envs start each cycle in groups of ``group_size`` from one seed (GRPO)."""

    @property
    def group_size(self) -> int: ...


@runtime_checkable
class MultiTaskData(TaskWeightSink, Protocol):
    """A DataModule whose env has named tasks (``task_names`` is None for a single-task env)."""

    @property
    def task_names(self) -> Sequence[str] | None: ...


@runtime_checkable
class MultiTaskEnv(TaskWeightedEnv, Protocol):
    """An env (its ``env.unwrapped``) with named tasks that takes DWR's task weights (``MetaWorldEnv``)."""

    task_names: Sequence[str]


@runtime_checkable
class WeightPublishing(Protocol):
    def request_drain(self) -> None: ...

    @property
    def last_sync(self) -> SyncStats | None: ...


@runtime_checkable
class ChecksDelivery(Protocol):
    """A DataModule that checks its receivers hold the weights it published (``sync/verified``)."""

    delivery: DeliveryCheck


@runtime_checkable
class ReportsFaults(Protocol):
    """A DataModule that counts the faults it recovered from (``faults/*`` totals)."""

    def fault_counters(self) -> dict[str, float]: ...


@runtime_checkable
class StopsSampling(Protocol):
    """A DataModule with background samplers: ``stop()`` ends them (idempotent); a stopping run calls
    it before its last checkpoint."""

    def stop(self) -> None: ...


@runtime_checkable
class EvaluationEnv(Protocol):
    """A DataModule that says which env it samples: ``(env_id, env_kwargs, wrapper settings)``."""

    def evaluation_env(self) -> tuple[str, dict[str, Any], list[dict[str, Any]]]: ...


@runtime_checkable
class ChecksEnvSpec(Protocol):
    """A module that refuses an env it cannot act in (sizes, action kind, observation keys)."""

    def check_env_spec(self, spec: object) -> None: ...


@runtime_checkable
class RolloutPolicyModule(Protocol):
    """What ``RolloutDataModule`` needs of any LightningModule: the ``policy`` the samplers copy and
    ``policy_version``, +1 after each update: new weights reach the samplers only when it changes."""

    policy: nn.Module
    policy_version: int


@runtime_checkable
class CopiesPolicy(Protocol):
    """A module that makes the samplers' CPU copy of its policy itself (a sharded one cannot be copied)."""

    def rollout_copy(self) -> nn.Module: ...


@runtime_checkable
class TrainsPolicy(RolloutPolicyModule, Protocol):
    """A :class:`RolloutPolicyModule` that also says how many optimizer steps one update takes."""

    optimizer_steps_per_update: int


def missing_members(obj: object, protocol: type) -> list[str]:
    """The members of ``protocol`` that ``obj`` lacks, sorted."""
    return sorted(n for n in get_protocol_members(protocol) if not hasattr(obj, n))


def implements(obj: object, protocol: type) -> bool:
    """Whether ``obj`` has every member of ``protocol``, looked up as attribute access finds it.

    Not ``isinstance``: from Python 3.12 that uses ``inspect.getattr_static``, which misses what
    ``nn.Module.__getattr__`` serves (such as a LightningModule's ``policy``)."""
    return obj is not None and not missing_members(obj, protocol)


def require(obj: object, protocol: type, *, who: str, what: str) -> None:
    """Raise ``TypeError`` unless ``obj`` implements ``protocol`` (``who`` needs it, as ``what``)."""
    if implements(obj, protocol):
        return
    missing = missing_members(obj, protocol)
    got = "no DataModule (trainer.datamodule is None)" if obj is None else type(obj).__name__
    raise TypeError(
        f"{who} needs {what} implementing fastlight.data.protocols.{protocol.__name__}; the run has "
        f"{got}" + (f", which lacks {', '.join(missing)}" if obj is not None and missing else "")
    )
