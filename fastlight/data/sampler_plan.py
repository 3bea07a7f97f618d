"""The sampler processes one rank runs, as a pure function of ``RolloutDataModule``'s settings
(:meth:`~fastlight.data.datamodule.RolloutDataModule.sampler_configs`): how the envs, seeds and
valid-step budget are split between them, and whether they end their rounds together."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal, get_args

from fastlight.envs.wrappers import AnyEnvWrapper
from fastlight.fleet.base import Fleet
from fastlight.sampling.bundle import SamplerConfig
from fastlight.sampling.round_signal import together_blockers

#: ``--data.rank_rounds``: ``together`` (refused where it cannot work), ``apart`` (each sampler ends
#: its own rounds: the same seeds give the same cycles), ``auto`` (``together`` where it can work).
RankRounds = Literal["auto", "together", "apart"]
RANK_ROUNDS: tuple[str, ...] = get_args(RankRounds)


def resolve_rank_rounds(settings: Mapping[str, Any], fleet: Fleet) -> Literal["together", "apart"]:
    """``--data.rank_rounds`` for these settings on ``fleet``: ``auto`` is ``together`` where it can work
    (no blockers, local samplers), else ``apart``; a ``together`` that cannot work is refused."""
    value = settings["rank_rounds"]
    names = ("reset_mode", "max_staleness", "termination_threshold", "cycles_per_step")
    blockers = together_blockers(**{k: settings[k] for k in names})
    if value == "apart" or (value == "auto" and (blockers or not fleet.shared_memory)):
        return "apart"
    if not fleet.shared_memory:
        raise ValueError(
            f"--data.rank_rounds together signals through the trainer machine's memory, which "
            f"{type(fleet).__name__}'s samplers cannot read: use auto or apart"
        )
    for flag, (wrong, allowed) in blockers.items():
        raise ValueError(
            f"--data.rank_rounds together with --data.max_staleness 0 shares one termination rate, "
            f"which needs {flag} {allowed} (the rank's samplers must sample the same cycles on the same "
            f"weights), got {wrong!r}; --data.rank_rounds auto ends them together only where it can"
        )
    return "together"


def sampler_configs(
    settings: Mapping[str, Any],
    *,
    rank: int,
    seed: int,
    env_wrappers: tuple[AnyEnvWrapper, ...],
    rank_rounds: str,
) -> list[SamplerConfig]:
    """One :class:`SamplerConfig` per sampler of trainer rank ``rank``.

    ``settings``: the DataModule's constructor arguments by name (a ``SamplerConfig`` field of the
    same name takes its value). ``seed``: the base env seed, offset per rank and sampler.
    """
    s = settings
    same = {f.name: s[f.name] for f in dataclasses.fields(SamplerConfig) if f.name in s}
    base, extra = divmod(s["num_envs"], s["num_workers"])
    configs = []
    for w in range(s["num_workers"]):
        envs = base + (w < extra)
        derived = {
            "num_envs": envs,
            "env_kwargs": dict(s["env_kwargs"] or {}),
            "env_wrappers": env_wrappers,
            "seed": seed + 10_000 * rank + 1_000 * w,
            "min_valid_steps": share(s["valid_steps_per_step"], envs, s["num_envs"]),
            "rank_rounds": rank_rounds,
        }
        configs.append(SamplerConfig(**(same | derived)))
    return configs


def share(total: int | None, envs: int, all_envs: int) -> int:
    """A sampler's part of a valid-step budget, by its share of the envs, rounded up; 0 = no budget."""
    return 0 if total is None else math.ceil(total * envs / all_envs)
