"""The sampler processes one rank runs, as a pure function of ``RolloutDataModule``'s settings
(:meth:`~fastlight.data.datamodule.RolloutDataModule.sampler_configs`): how the envs, seeds and
valid-step budget are split between them, and whether they end their rounds together."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from fastlight.data.data_settings import rank_rounds_blockers
from fastlight.envs.wrappers import AnyEnvWrapper
from fastlight.sampling.bundle import SamplerConfig
from fastlight.sampling.round_signal import resolve_rank_rounds


def resolve_rounds(settings: Mapping[str, Any], *, shared_memory: bool) -> str:
    """``together`` or ``apart``: ``--data.rank_rounds`` with ``auto`` resolved
    (:func:`~fastlight.sampling.round_signal.resolve_rank_rounds`)."""
    return resolve_rank_rounds(
        settings["rank_rounds"], blockers=rank_rounds_blockers(settings), shared_memory=shared_memory
    )


def sampler_configs(
    settings: Mapping[str, Any],
    *,
    rank: int,
    seed: int,
    env_wrappers: tuple[AnyEnvWrapper, ...],
    shared_memory: bool,
) -> list[SamplerConfig]:
    """One :class:`SamplerConfig` per sampler of trainer rank ``rank``.

    ``settings``: the DataModule's constructor arguments by name; a ``SamplerConfig`` field named
    like one of them takes its value as it is, the others are derived here. ``seed``: the base env
    seed (each sampler's is offset by rank and index, so no two clips of a run share one);
    ``shared_memory``: whether the fleet's samplers share the trainer machine's memory.
    """
    s = settings
    same = {f.name: s[f.name] for f in dataclasses.fields(SamplerConfig) if f.name in s}
    base, extra = divmod(s["num_envs"], s["num_workers"])
    rounds = resolve_rounds(s, shared_memory=shared_memory)
    configs = []
    for w in range(s["num_workers"]):
        envs = base + (w < extra)
        derived = {
            "num_envs": envs,
            "env_kwargs": dict(s["env_kwargs"] or {}),
            "env_wrappers": env_wrappers,
            "seed": seed + 10_000 * rank + 1_000 * w,
            "min_valid_steps": share(s["valid_steps_per_step"], envs, s["num_envs"]),
            "rank_rounds": rounds,
        }
        configs.append(SamplerConfig(**(same | derived)))
    return configs


def share(total: int | None, envs: int, all_envs: int) -> int:
    """A sampler's part of a valid-step budget, by its share of the envs (rounded up, so the
    parts add up to at least ``total``); 0 = no budget."""
    return 0 if total is None else math.ceil(total * envs / all_envs)
