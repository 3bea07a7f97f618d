"""Row-by-row assembly of a Rollout while a Collector steps its envs."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from fastlight.models.base import ActOutput
from fastlight.rollout import EpisodeRecord, Rollout, RolloutStats
from fastlight.sampling.obs import obs_to_tensor

#: The Rollout fields a Row holds as numpy arrays of the same name.
_NUMPY_FIELDS = ("rewards", "terminated", "truncated", "valid", "step", "task_id", "bootstrap_values")


class Step(NamedTuple):
    """One policy step of a Collector: all E observations (stacked once), the active envs' episode
    steps and policy outputs, the weights' version (-1: unknown) and the envs' step results."""

    obs: Any
    step: Tensor
    act: ActOutput
    version: int
    results: list[tuple]


class Row:
    """One time step of E envs while it is being filled (numpy, cheap to write per env).

    With action chunks of ``chunk`` env steps (``None``: none), ``step_rewards [E, chunk]`` and
    ``env_steps [E]`` record each env's executed steps, and ``span`` is the env-step budget the
    row's chunks had (``chunk``, or less where the cycle's budget ran out)."""

    def __init__(self, num_envs: int, chunk: int | None = None, span: int = 1) -> None:
        self.span = span
        self.step_rewards = None if chunk is None else np.zeros((num_envs, chunk), dtype=np.float32)
        self.env_steps = None if chunk is None else np.zeros(num_envs, dtype=np.int64)
        self.rewards = np.zeros(num_envs, dtype=np.float32)
        self.terminated = np.zeros(num_envs, dtype=bool)
        self.truncated = np.zeros(num_envs, dtype=bool)
        self.bootstrap_values = np.zeros(num_envs, dtype=np.float32)
        self.valid = np.zeros(num_envs, dtype=bool)
        self.step = np.zeros(num_envs, dtype=np.int64)
        self.task_id = np.zeros(num_envs, dtype=np.int64)
        self.obs: Any = None
        self.actions: Tensor | None = None
        self.logprobs: Tensor | None = None
        self.values: Tensor | None = None
        self.version = -1  # -1: the Collector's policy_version argument applies

    def set_step(self, i: int, reward: float, terminated: bool, truncated: bool) -> None:
        self.rewards[i] = reward
        self.terminated[i] = terminated
        self.truncated[i] = truncated and not terminated

    def set_chunk(self, i: int, rewards: list[float], terminated: bool, truncated: bool) -> None:
        """Env ``i`` executed ``len(rewards)`` steps of its chunk: ``reward`` is their sum."""
        assert self.step_rewards is not None and self.env_steps is not None
        self.set_step(i, float(sum(rewards)), terminated, truncated)
        self.step_rewards[i, : len(rewards)] = rewards
        self.env_steps[i] = len(rewards)

    def set_truncated(self, i: int) -> None:
        self.truncated[i] = True

    def invalidate(self, i: int) -> None:
        """Env ``i``'s step in this row becomes padding (a dropped episode)."""
        self.valid[i] = False
        self.rewards[i] = self.bootstrap_values[i] = 0.0
        self.terminated[i] = self.truncated[i] = False
        if self.step_rewards is not None and self.env_steps is not None:
            self.step_rewards[i] = 0.0
            self.env_steps[i] = 0


def _scatter(values: Tensor, active: list[int], num_envs: int) -> Tensor:
    """[len(active), ...] -> [E, ...] with zeros for the envs that were not stepped (dummy steps)."""
    out = values.new_zeros((num_envs, *values.shape[1:]))
    out[torch.as_tensor(active, dtype=torch.long)] = values
    return out


class RowBuffer:
    """Collects Rows and finished episodes; ``to_rollout`` stacks them into ``[T, E, ...]``.
    ``chunk``: env steps per action chunk (``None``: one env action per policy step)."""

    def __init__(self, num_envs: int, chunk: int | None = None) -> None:
        self.num_envs = num_envs
        self.chunk = chunk
        self.rows: list[Row] = []
        self.episodes: list[EpisodeRecord] = []

    def new_row(self, out: Step, episodes: list[Any], active: list[int], span: int = 1) -> Row:
        """Start row t from one policy step over the ``active`` envs. ``out.obs`` holds every
        env's pre-step observation: the stepped envs' current one and, for ended envs, their
        frozen final one (DPSA dummy steps). ``span``: the env-step budget of the row's chunks."""
        row = Row(self.num_envs, self.chunk, span)
        row.obs = out.obs
        row.actions = _scatter(out.act.actions, active, self.num_envs)
        row.logprobs = _scatter(out.act.logprobs, active, self.num_envs)
        row.values = _scatter(out.act.values, active, self.num_envs)
        row.valid[active] = True
        row.step[active] = out.step.numpy()
        row.task_id[:] = [ep.task_id for ep in episodes]
        row.version = out.version
        self.rows.append(row)
        return row

    def to_rollout(self, *, policy_version: int, stats: RolloutStats) -> Rollout:
        """The Rows as one Rollout, with the finished episodes added to ``stats``."""
        rows = self.rows
        stats.episodes.extend(self.episodes)
        if isinstance(rows[0].obs, dict):
            obs: Any = {k: np.stack([r.obs[k] for r in rows]) for k in rows[0].obs}
        else:
            obs = np.stack([r.obs for r in rows])

        def stack(name: str) -> Tensor:
            return torch.from_numpy(np.stack([getattr(r, name) for r in rows]))

        chunked = self.chunk is not None
        # Per-row version where a remote policy reports one (it may change mid-round).
        versions = [[r.version if r.version >= 0 else policy_version] * self.num_envs for r in rows]
        return Rollout(
            obs=obs_to_tensor(obs),
            actions=torch.stack([r.actions for r in rows]),
            logprobs=torch.stack([r.logprobs for r in rows]),
            values=torch.stack([r.values for r in rows]).float(),
            **{name: stack(name) for name in _NUMPY_FIELDS},
            policy_version=torch.tensor(versions, dtype=torch.long),
            stats=stats,
            step_rewards=stack("step_rewards") if chunked else None,
            env_steps=stack("env_steps") if chunked else None,
        )

    def raw_env_steps(self) -> int:
        """Env-step slots of the buffer, dummy ones included: each row spans its chunks' budget."""
        return self.num_envs * sum(r.span for r in self.rows)
