"""The reset side of a :class:`~fastlight.sampling.collector.Collector`: global and partial resets of
its envs, the reset done ahead of a cycle, and the names a failing env is reported by.

Slow resets of several envs run on a thread pool, so I/O-bound scenario loads overlap
(``ScenarioLoadCost``); cheap ones run inline, where a thread hand-off would cost more.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym

from fastlight.rollout import RolloutStats
from fastlight.sampling.collector_settings import ResetTraits
from fastlight.sampling.env_faults import EnvError, NonFiniteError, is_finite, preview
from fastlight.sampling.episodes import Episode
from fastlight.sampling.exact import reset_seed
from fastlight.sampling.obs import ObservationShapeError, odd_observation

#: Resets in a row of one env that may return a non-finite observation under ``nonfinite="drop"``
#: before the run stops anyway: an env that never resets cleanly cannot produce data.
RESET_RETRIES = 3
#: Resets slower than this (running mean of one env's reset, seconds) go to the thread pool.
POOL_RESET_S = 2e-3


class EnvResets:
    """Resets and failure naming over ``envs``; :class:`~fastlight.sampling.collector.Collector`
    builds on it (its ``__init__`` sets every attribute annotated here)."""

    envs: list[gym.Env]
    traits: ResetTraits
    seed: int
    group_size: int
    nonfinite: str
    heartbeat: Callable[[], None]
    reset_cost: float | None
    _pool: ThreadPoolExecutor
    resets: int
    _obs: list[Any] | None
    _eps: list[Episode]
    _seeds: list[int | None]
    _ahead: tuple[RolloutStats, float] | None

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def reset_ahead(self) -> None:
        """Do the next ``dpsa``/``sgr`` cycle's global reset now, while the sampler waits for weights.

        The cycle that follows is the same (seeds, observations) and its time still counts in it.
        A second call before that cycle, or one in ``autoreset`` mode, does nothing."""
        if not self.traits.cycles or self._ahead is not None:
            return
        stats = RolloutStats()
        t0 = time.perf_counter()
        self._reset(range(self.num_envs), stats)
        self._ahead = (stats, time.perf_counter() - t0)

    def discard_ahead(self) -> None:
        """Forget a reset done ahead (drawn from task weights since replaced)."""
        self._ahead = None

    def _global_reset(self, stats: RolloutStats) -> float:
        """A cycle's global reset: now (returns 0.0) or the one reset_ahead() did (returns its seconds)."""
        if self._ahead is None:
            self._reset(range(self.num_envs), stats)
            return 0.0
        ahead, seconds = self._ahead
        self._ahead = None
        stats.reset_time += ahead.reset_time
        stats.dropped_nonfinite += ahead.dropped_nonfinite
        return seconds

    def _reset(self, indices: Sequence[int], stats: RolloutStats) -> None:
        """Reset the given envs (concurrently while resets are slow)."""
        if self._obs is None:
            self._obs = [None] * self.num_envs
            self._eps = [Episode() for _ in self.envs]

        def one(i: int) -> tuple[int, Any, dict, int, float]:
            # A global reset seeds every env from the count (a GRPO group alike); alone, its own RNG.
            seed = reset_seed(self.seed, self.resets, i // self.group_size) if every else None
            if seed is not None:
                self._seeds[i] = seed
            dropped = 0
            t = time.perf_counter()
            try:
                obs, info = self.envs[i].reset(seed=seed)
                cost = time.perf_counter() - t
                self.heartbeat()
                # Under "drop", a reset with NaN / inf has no episode yet: reset again (a new start).
                while self.nonfinite == "drop" and not is_finite(obs) and dropped < RESET_RETRIES:
                    dropped += 1
                    obs, info = self.envs[i].reset()
                    self.heartbeat()
            except Exception as e:
                raise self._env_error(i, e, reset=True) from e
            return i, obs, info, dropped, cost

        every = len(indices) == self.num_envs
        t0 = time.perf_counter()
        pooled = len(indices) > 1 and (self.reset_cost is None or self.reset_cost >= POOL_RESET_S)
        results = self._pool.map(one, indices) if pooled else map(one, indices)
        for i, obs, info, dropped, cost in results:
            # 0.9/0.1 mean: a scenario-load env stays on the pool after one fast reset.
            self.reset_cost = cost if self.reset_cost is None else 0.9 * self.reset_cost + 0.1 * cost
            self._obs[i] = obs
            self._eps[i] = Episode(task_id=int(info.get("task_id", 0)))
            stats.dropped_nonfinite += dropped
            where = f"{dropped + 1} resets in a row" if dropped else "reset"
            self._check_finite(i, f"observation (from {where})", obs)
        stats.reset_time += time.perf_counter() - t0
        if every:
            self.resets += 1

    def _check_finite(self, i: int, what: str, value: Any) -> None:
        """Stop at the env that produced a NaN / inf, before it reaches a loss or the weights."""
        if is_finite(value):
            return
        raise NonFiniteError(
            f"{self._where(i)} returned a non-finite {what} at episode step {self._eps[i].step}: "
            f"{preview(value)} (--data.nonfinite drop drops such episodes instead)"
        )

    def _where(self, i: int) -> str:
        env = self.envs[i]
        name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
        seed = self._seeds[i]  # the seed of its last global reset (its group's, with group_size > 1)
        if seed is None:  # none since a restored state: the one before it
            seed = reset_seed(self.seed, max(self.resets - 1, 0), i // self.group_size)
        return f"env {name} (index {i} of this sampler, seed {seed})"

    def _env_error(self, i: int, error: Exception, *, reset: bool = False) -> EnvError:
        """Env ``i``'s own exception, named: which env of which seed, and where in its episode."""
        when = "in reset" if reset else f"at episode step {self._eps[i].step + 1}"
        return EnvError(f"{self._where(i)} raised {type(error).__name__} {when}: {error}")

    def _shape_error(self, indices: Sequence[int], error: ObservationShapeError) -> ObservationShapeError:
        """The env whose observation does not stack with the others' (``indices``: those stacked)."""
        spaces = [self.envs[i].observation_space for i in indices]
        odd = odd_observation([self._obs[i] for i in indices], spaces)
        j, shape, others = odd if odd is not None else (error.index, error.shape, error.others)
        i = indices[j]
        message = (
            f"{self._where(i)} returned an observation of shape {shape} at episode step {self._eps[i].step}; "
            f"the others have shape {others} (its observation_space: {self.envs[i].observation_space})"
        )
        return ObservationShapeError(message, i, shape, others)
