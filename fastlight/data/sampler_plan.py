"""The sampler processes one rank runs, as a pure function of ``RolloutDataModule``'s settings
(:meth:`~fastlight.data.datamodule.RolloutDataModule.sampler_configs`): how the envs, seeds and
valid-step budget are split between them, and which round-ending rules they follow."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fastlight.data.data_settings import truncation_blockers
from fastlight.envs.wrappers import EnvWrapper
from fastlight.sampling.shared_cut import resolve_scope
from fastlight.sampling.worker import SamplerConfig


def resolve_cut_in_flight(settings: Mapping[str, Any], *, shared_memory: bool) -> bool:
    """``--data.cut_in_flight`` with ``None`` resolved: on for an asynchronous run (``max_staleness``
    above 0) whose samplers share the trainer machine's memory."""
    if settings["cut_in_flight"] is not None:
        return bool(settings["cut_in_flight"])
    return settings["max_staleness"] > 0 and shared_memory


def resolve_truncation_scope(settings: Mapping[str, Any], *, shared_memory: bool) -> str:
    """``sampler`` or ``rank``: ``--data.truncation_scope`` with ``auto`` resolved
    (:func:`~fastlight.sampling.shared_cut.resolve_scope`)."""
    return resolve_scope(
        settings["truncation_scope"], blockers=truncation_blockers(settings), shared_memory=shared_memory
    )


def sampler_configs(
    settings: Mapping[str, Any],
    *,
    rank: int,
    seed: int,
    env_wrappers: tuple[EnvWrapper, ...],
    shared_memory: bool,
) -> list[SamplerConfig]:
    """One :class:`SamplerConfig` per sampler of trainer rank ``rank``.

    ``settings``: the DataModule's constructor arguments by name; ``seed``: the base env seed
    (each sampler's is offset by rank and index, so no two clips of a run share one);
    ``shared_memory``: whether the fleet's samplers share the trainer machine's memory.
    """
    s = settings
    base, extra = divmod(s["num_envs"], s["num_workers"])
    scope = resolve_truncation_scope(s, shared_memory=shared_memory)
    cut = resolve_cut_in_flight(s, shared_memory=shared_memory)
    return [
        SamplerConfig(
            env_id=s["env_id"],
            num_envs=base + (w < extra),
            env_kwargs=dict(s["env_kwargs"] or {}),
            reset_mode=s["reset_mode"],
            termination_threshold=s["termination_threshold"],
            max_horizon=s["max_horizon"],
            rollout_steps=s["rollout_steps"],
            cycles_per_step=s["cycles_per_step"],
            min_valid_steps=share(s["valid_steps_per_step"], base + (w < extra), s["num_envs"]),
            max_staleness=s["max_staleness"],
            env_wrappers=env_wrappers,
            seed=seed + 10_000 * rank + 1_000 * w,
            nonfinite=s["nonfinite"],
            truncation_scope=scope,
            cut_in_flight=cut,
        )
        for w in range(s["num_workers"])
    ]


def share(total: int | None, envs: int, all_envs: int) -> int:
    """A sampler's part of a valid-step budget, by its share of the envs (rounded up, so the
    parts add up to at least ``total``); 0 = no budget."""
    return 0 if total is None else math.ceil(total * envs / all_envs)
