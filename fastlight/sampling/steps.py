"""One policy step of a :class:`~fastlight.sampling.collector.Collector` over its active envs, with
action chunks, and how each env's step is recorded into the Rollout's row.

**Action chunks** (:mod:`fastlight.rollout`): each policy step executes every active env's chunk
open-loop, up to ``H`` env steps; an env whose episode ends inside its chunk drops the rest of it.
Every budget counts env steps, not chunks: ``max_horizon`` (the last chunk of a cycle is cut to what
is left of it), ``rollout_steps``, the episode lengths, the ``step`` index, the DPSA threshold's
model and the stats' ``raw_steps`` / ``valid_steps``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from fastlight.models.base import Policy
from fastlight.rollout import RolloutStats, success_after
from fastlight.sampling.env_faults import is_finite
from fastlight.sampling.episodes import ChunkResult, record
from fastlight.sampling.obs import ObservationShapeError, action_to_env, obs_to_tensor, stack_obs
from fastlight.sampling.resets import EnvResets
from fastlight.sampling.rows import Row, RowBuffer, Step


class EnvSteps(EnvResets):
    """Acting and stepping over ``envs``; :class:`~fastlight.sampling.collector.Collector` builds on it
    (its ``__init__`` sets every attribute annotated here and in :class:`EnvResets`)."""

    _served: bool  # the current round's policy is served by the inference worker
    _chunk: int | None  # the current round's policy acts in chunks of this many env steps

    def _step_envs(self, policy: Policy, active: list[int], stats: RolloutStats, span: int = 1) -> Step:
        """Act on the active envs and step them (with action chunks, for at most ``span`` env steps).
        The row stores every env's observation (frozen in DPSA dummy steps), the policy sees the active."""
        try:
            all_obs = stack_obs(self._obs)
        except ObservationShapeError as e:
            raise self._shape_error(range(self.num_envs), e) from e.__cause__  # numpy's error
        sel = all_obs
        if len(active) < self.num_envs:
            idx = np.asarray(active)
            sel = {k: v[idx] for k, v in all_obs.items()} if isinstance(all_obs, dict) else all_obs[idx]
        step = torch.tensor([self._eps[i].step for i in active], dtype=torch.long)
        out = policy.act(obs_to_tensor(sel), step=step)
        acts, chunked = action_to_env(policy, out.actions), self._chunk is not None
        results: list[tuple] = [
            self._run_chunk(i, acts[j], span, stats) if chunked else self._env_step(i, acts[j], stats)
            for j, i in enumerate(active)
        ]
        # A remote policy reports the version of the weights that answered (may change mid-round).
        version = policy.last_version if self._served else -1
        return Step(all_obs, step, out, version, results)

    def _env_step(self, i: int, action: Any, stats: RolloutStats) -> tuple:
        """``envs[i].step(action)``, timed, with a heartbeat; an exception is named (:meth:`_env_error`)."""
        t0 = time.perf_counter()
        try:
            result = self.envs[i].step(action)
        except Exception as e:
            raise self._env_error(i, e) from e
        stats.step_time += time.perf_counter() - t0
        self.heartbeat()
        return result

    def _accept(self, i: int, reward: Any, nobs: Any, info: dict) -> None:
        """Check a step's values (a NaN / inf stops the run) and add the step to env ``i``'s episode."""
        self._check_finite(i, "reward", reward)
        self._check_finite(i, "observation", nobs)
        ep = self._eps[i]
        ep.ret += float(reward)
        ep.success = success_after(ep.success, info)
        self._obs[i] = nobs

    def _run_chunk(self, i: int, chunk: Any, span: int, stats: RolloutStats) -> ChunkResult:
        """Env ``i`` executes its action chunk ``[H, ...]`` open-loop for at most ``span`` env steps,
        stopping where its episode ends; each step is checked and counted as an unchunked step is."""
        ep = self._eps[i]
        rewards: list[float] = []
        info: dict = {}
        for k, action in enumerate(chunk[:span]):
            act = action.item() if np.ndim(action) == 0 else action
            nobs, reward, term, trunc, info = self._env_step(i, act, stats)
            ep.step += 1
            if self.nonfinite == "drop" and not (is_finite(reward) and is_finite(nobs)):
                return ChunkResult(k + 1, rewards, False, False, info, dropped=True)
            self._accept(i, reward, nobs, info)
            rewards.append(float(reward))
            if term or trunc:
                return ChunkResult(k + 1, rewards, bool(term), bool(trunc), info, dropped=False)
        return ChunkResult(len(rewards), rewards, False, False, info, dropped=False)

    def _advance(self, row: Row, i: int, result: tuple, rows: RowBuffer, stats: RolloutStats) -> bool:
        """Record env ``i``'s step (or executed chunk, whose env steps :meth:`_run_chunk` counted) in
        ``row``; returns True if its episode ended (or was dropped)."""
        ep = self._eps[i]
        ep.transitions += 1
        if isinstance(result, ChunkResult):
            dropped, term, trunc, info = result.dropped, result.terminated, result.truncated, result.info
            if not dropped:
                row.set_chunk(i, result.rewards, term, trunc)
        else:
            nobs, reward, term, trunc, info = result
            ep.step += 1  # the env's step count: the failing step is named by it (0 = the reset)
            dropped = self.nonfinite == "drop" and not (is_finite(reward) and is_finite(nobs))
            if not dropped:
                self._accept(i, reward, nobs, info)
                row.set_step(i, float(reward), bool(term), bool(trunc))
        if dropped:
            self._drop_episode(i, rows, stats)
            return True
        if term or trunc:
            rows.episodes.append(record(ep, terminated=bool(term), truncated=bool(trunc), info=info))
            return True
        return False

    def _drop_episode(self, i: int, rows: RowBuffer, stats: RolloutStats) -> None:
        """Env ``i``'s current episode becomes padding in this buffer (its last ``ep.transitions`` rows
        at most); its frozen observation stays the last finite one, and no episode is recorded."""
        for r in rows.rows[-min(self._eps[i].transitions, len(rows.rows)) :]:
            r.invalidate(i)
        stats.dropped_nonfinite += 1

    def _bootstrap(self, policy: Policy, row: Row) -> None:
        """V(s_{t+1}) for every env truncated in this row, in one batched critic call."""
        idx = [i for i in range(self.num_envs) if row.truncated[i]]
        if not idx:
            return
        # Called before any reset, so self._obs[i] is still s_{t+1} of the ended episode.
        try:
            obs = obs_to_tensor(stack_obs([self._obs[i] for i in idx]))
        except ObservationShapeError as e:
            raise self._shape_error(idx, e) from e.__cause__
        step = torch.tensor([self._eps[i].step for i in idx], dtype=torch.long)
        values = policy.value(obs, step=step)
        for j, i in enumerate(idx):
            row.bootstrap_values[i] = float(values[j])
