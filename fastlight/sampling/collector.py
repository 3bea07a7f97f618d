"""Stepping E gymnasium envs into Rollouts under one of four reset modes (FAST §DPSA).

- ``dpsa``: an env that ends emits *dummy steps* (``valid=False``, observation frozen, reward 0,
  no simulator call) while the others keep going. A *unified truncation* - one global reset
  of every env - happens when the fraction of ended envs reaches ``termination_threshold`` or
  when ``max_horizon`` steps have passed; the still-running envs are then marked ``truncated``
  and bootstrapped from V(s_{t+1}). One ``collect()`` is one such sampling cycle.
- ``sgr``: Synchronous Global Reset, the baseline FAST improves on: a global reset as soon as
  any env ends (the same as ``dpsa`` with ``termination_threshold = 1/E``).
- ``autoreset``: each env resets on its own when it ends, as gymnasium vector envs do; one
  ``collect()`` is ``rollout_steps`` steps and episodes carry over between calls.
- ``sequential``: ``autoreset`` over exactly one env, the baseline of FAST's speed-up table.

**Action chunks.** With a policy whose action mapping is chunked
(:class:`~fastlight.models.action_mapping.ChunkedActionMapping`, ``H`` env actions per call), each
policy step executes every active env's chunk open-loop, up to ``H`` env steps, and records one
transition per chunk (``step_rewards``, ``env_steps``: see :mod:`fastlight.rollout`). An env whose
episode ends inside its chunk stops there and the rest of the chunk is dropped (in ``autoreset`` it
resets and starts a fresh chunk at the next policy step). Every budget counts env steps, not
chunks: ``max_horizon`` (the last chunk of a cycle is cut to what is left of it), ``rollout_steps``
(``ceil(rollout_steps / H)`` policy steps), the episode lengths, the ``step`` index, the DPSA
threshold's model and the stats' ``raw_steps`` / ``valid_steps``.

Resets (overlapped on a thread pool while they are slow) and the naming of a failing env live in
:mod:`fastlight.sampling.resets`; the checks of what an env returns in :mod:`fastlight.sampling.env_faults`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from fastlight.models.action_mapping import action_chunk
from fastlight.models.base import Policy, ServedPolicy
from fastlight.rollout import Rollout, RolloutStats, success_after
from fastlight.sampling.auto_threshold import AUTO, CycleCosts, ThresholdChooser
from fastlight.sampling.collector_settings import (
    NONFINITE,
    RESET_MODES,
    Nonfinite,
    ResetMode,
    check_collector_settings,
)
from fastlight.sampling.cut_requests import CutRequestView
from fastlight.sampling.env_faults import EnvError, NonFiniteError, is_finite
from fastlight.sampling.episodes import ChunkResult, Episode, record
from fastlight.sampling.obs import (
    ObservationShapeError,
    action_to_env,
    obs_to_tensor,
    stack_obs,
)
from fastlight.sampling.resets import POOL_RESET_S, RESET_RETRIES, EnvResets
from fastlight.sampling.rows import Row, RowBuffer, Step
from fastlight.sampling.shared_cut import SharedCutView

__all__ = [
    "NONFINITE", "POOL_RESET_S", "RESET_MODES", "RESET_RETRIES", "Collector", "EnvError", "NonFiniteError",
    "Nonfinite", "ResetMode", "check_collector_settings", "is_finite",
]


class Collector(EnvResets):
    """Steps ``envs`` with a policy and returns one :class:`~fastlight.rollout.Rollout` per call.

    Args:
        envs: the E environments (``len(envs) == 1`` for ``sequential``).
        mode: ``dpsa | sgr | autoreset | sequential``.
        termination_threshold: DPSA's unified-truncation threshold on the fraction of ended envs,
            or ``"auto"``: chosen every cycle from the measured step cost, reset cost and episode
            lengths (:class:`~fastlight.sampling.auto_threshold.ThresholdChooser`).
        max_horizon: DPSA/SGR cycle length cap in env steps; reaching it truncates and bootstraps.
        rollout_steps: env steps per env per ``collect()`` in ``autoreset`` / ``sequential`` mode
            (with action chunks of ``H``: ``ceil(rollout_steps / H)`` policy steps).
        seed: env ``i`` is first reset with ``seed + i``; later resets continue its RNG.
        nonfinite: what a NaN / inf observation or reward from an env does: ``raise`` stops the
            run (:class:`NonFiniteError` naming env, index, seed, step, field); ``drop`` turns the
            episode's steps in this Rollout into padding (``valid=False``), ends it there and counts
            it in ``stats.dropped_nonfinite``. A reset that returns a non-finite observation is
            dropped the same way and the env reset again, up to ``RESET_RETRIES`` times in a row.
        heartbeat: called after every env step and reset (a sampler's progress signal, which the
            trainer watches to restart a sampler stuck in an env).
        shared_cut: this sampler's handle on its rank's :class:`~fastlight.sampling.shared_cut.SharedCut`
            (``--data.truncation_scope rank``): a ``collect`` given a ``cut_key`` truncates on the
            rate over every clip of the rank; ``None``: on this Collector's clips only.
        cut_requests: this sampler's side of its rank's
            :class:`~fastlight.sampling.cut_requests.CutRequests` (``--data.cut_in_flight``): a
            ``collect`` given ``cut_since`` ends at the first step after the count passes it.
    """

    def __init__(
        self,
        envs: Sequence[gym.Env],
        *,
        mode: str = "dpsa",
        termination_threshold: float | str = 0.5,
        max_horizon: int = 200,
        rollout_steps: int = 128,
        seed: int = 0,
        nonfinite: str = "raise",
        heartbeat: Callable[[], None] | None = None,
        shared_cut: SharedCutView | None = None,
        cut_requests: CutRequestView | None = None,
    ) -> None:
        if shared_cut is not None and (mode not in ("dpsa", "sgr") or termination_threshold == AUTO):
            raise ValueError(
                "a rank-wide truncation (--data.truncation_scope rank) needs --data.reset_mode dpsa or "
                f"sgr and a fixed --data.termination_threshold, got {mode} / {termination_threshold}"
            )
        check_collector_settings(
            mode=mode,
            num_envs=len(envs),
            termination_threshold=termination_threshold,
            max_horizon=max_horizon,
            rollout_steps=rollout_steps,
            nonfinite=nonfinite,
        )
        self.nonfinite = nonfinite
        self.shared_cut = shared_cut
        self.cut_requests = cut_requests
        self._cut_since: int | None = None  # the current collect's cut_since
        self.heartbeat = heartbeat if heartbeat is not None else _no_beat
        self.envs = list(envs)
        self.mode = mode
        self.termination_threshold = termination_threshold
        # `auto`: one chooser per Collector, from this sampler's own costs (dpsa only: sgr cuts at
        # the first end by definition, autoreset never cuts).
        self.chooser = (
            ThresholdChooser(len(self.envs), max_horizon, seed=seed)
            if termination_threshold == AUTO and mode == "dpsa"
            else None
        )
        self.max_horizon = max_horizon
        self.rollout_steps = rollout_steps
        self.seed = seed
        self._pool = ThreadPoolExecutor(max_workers=len(self.envs), thread_name_prefix="fastlight-reset")
        self._seeded = False
        self._obs: list[Any] | None = None  # current observation of each env (autoreset carry-over)
        self._eps: list[Episode] = []
        self._served = False  # the current round's policy is served by the inference worker
        self._chunk: int | None = None  # the current round's policy acts in chunks of this many env steps
        # Running mean of one env.reset() in seconds; None until the first reset was timed (the
        # first global reset uses the pool: a scenario load may be slow).
        self.reset_cost: float | None = None
        # The next dpsa/sgr cycle's global reset, done ahead by reset_ahead(): its counters and
        # wall seconds, charged to that cycle.
        self._ahead: tuple[RolloutStats, float] | None = None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for env in self.envs:
            env.close()

    # ------------------------------------------------------------------ one step of a subset
    def _step_envs(self, policy: Policy, active: list[int], stats: RolloutStats, span: int = 1) -> Step:
        """Act on the active envs and step them. Every env's observation is stacked once: the
        row stores all of them (frozen ones for DPSA dummy steps), the policy sees the active ones.
        With action chunks each env runs its chunk for at most ``span`` env steps (:meth:`_run_chunk`)."""
        try:
            all_obs = stack_obs(self._obs)
        except ObservationShapeError as e:
            raise self._shape_error(range(self.num_envs), e) from e.__cause__  # numpy's error
        if len(active) < self.num_envs:
            idx = np.asarray(active)
            sel = {k: v[idx] for k, v in all_obs.items()} if isinstance(all_obs, dict) else all_obs[idx]
        else:
            sel = all_obs
        step = torch.tensor([self._eps[i].step for i in active], dtype=torch.long)
        out = policy.act(obs_to_tensor(sel), step=step)
        env_actions = action_to_env(policy, out.actions)
        results: list[tuple] = []
        for j, i in enumerate(active):
            if self._chunk is not None:
                results.append(self._run_chunk(i, env_actions[j], span, stats))
                continue
            t0 = time.perf_counter()
            try:
                results.append(self.envs[i].step(env_actions[j]))
            except Exception as e:
                raise self._env_error(i, e) from e
            stats.step_time += time.perf_counter() - t0
            self.heartbeat()
        # A remote policy reports the version of the weights that answered (may change mid-round).
        version = policy.last_version if self._served else -1
        return Step(all_obs, step, out, version, results)

    def _run_chunk(self, i: int, chunk: Any, span: int, stats: RolloutStats) -> ChunkResult:
        """Env ``i`` executes its action chunk ``[H, ...]`` open-loop for at most ``span`` env steps,
        stopping where its episode ends (the rest of the chunk is dropped). Each step is checked and
        counted as an unchunked step is, so a failure names its episode step."""
        ep, env = self._eps[i], self.envs[i]
        rewards: list[float] = []
        info: dict = {}
        for k in range(min(len(chunk), span)):
            action = chunk[k]
            t0 = time.perf_counter()
            try:
                nobs, reward, term, trunc, info = env.step(action.item() if np.ndim(action) == 0 else action)
            except Exception as e:
                raise self._env_error(i, e) from e
            stats.step_time += time.perf_counter() - t0
            self.heartbeat()
            ep.step += 1
            if self.nonfinite == "drop" and not (is_finite(reward) and is_finite(nobs)):
                return ChunkResult(k + 1, rewards, False, False, info, dropped=True)
            self._check_finite(i, "reward", reward)
            self._check_finite(i, "observation", nobs)
            rewards.append(float(reward))
            ep.ret += float(reward)
            ep.success = success_after(ep.success, info)
            self._obs[i] = nobs
            if term or trunc:
                return ChunkResult(k + 1, rewards, bool(term), bool(trunc), info, dropped=False)
        return ChunkResult(len(rewards), rewards, False, False, info, dropped=False)

    def _advance(self, row: Row, i: int, result: tuple, rows: RowBuffer, stats: RolloutStats) -> bool:
        """Record env ``i``'s step in ``row``; returns True if its episode ended (or was dropped)."""
        if isinstance(result, ChunkResult):
            return self._advance_chunk(row, i, result, rows, stats)
        nobs, reward, term, trunc, info = result
        ep = self._eps[i]
        ep.transitions += 1
        ep.step += 1  # the env's step count: the failing step is named by it (0 = the reset)
        if self.nonfinite == "drop" and not (is_finite(reward) and is_finite(nobs)):
            self._drop_episode(i, rows, stats)
            return True
        self._check_finite(i, "reward", reward)
        self._check_finite(i, "observation", nobs)
        row.set_step(i, float(reward), bool(term), bool(trunc))
        ep.ret += float(reward)
        ep.success = success_after(ep.success, info)
        self._obs[i] = nobs
        if term or trunc:
            rows.episodes.append(record(ep, terminated=bool(term), truncated=bool(trunc), info=info))
            return True
        return False

    def _advance_chunk(
        self, row: Row, i: int, chunk: ChunkResult, rows: RowBuffer, stats: RolloutStats
    ) -> bool:
        """Record env ``i``'s executed chunk in ``row`` (the steps were counted by :meth:`_run_chunk`)."""
        ep = self._eps[i]
        ep.transitions += 1
        if chunk.dropped:
            self._drop_episode(i, rows, stats)
            return True
        row.set_chunk(i, chunk.rewards, chunk.terminated, chunk.truncated)
        if chunk.terminated or chunk.truncated:
            rows.episodes.append(
                record(ep, terminated=chunk.terminated, truncated=chunk.truncated, info=chunk.info)
            )
            return True
        return False

    def _drop_episode(self, i: int, rows: RowBuffer, stats: RolloutStats) -> None:
        """Env ``i``'s current episode becomes padding in this buffer (its steps here are the last
        ``ep.transitions`` rows at most; earlier ones went out, finite, in an earlier Rollout). Its
        frozen observation stays the last finite one, and no episode is recorded."""
        for r in rows.rows[-min(self._eps[i].transitions, len(rows.rows)) :]:
            r.invalidate(i)
        stats.dropped_nonfinite += 1

    # ------------------------------------------------------------------ public API
    @torch.no_grad()
    def collect(
        self,
        policy: Policy,
        *,
        policy_version: int = 0,
        cut_key: int | None = None,
        cut_since: int | None = None,
    ) -> Rollout:
        """One sampling cycle (``dpsa``/``sgr``) or ``rollout_steps`` steps (``autoreset``).

        ``cut_key``: with a ``shared_cut``, this cycle's key
        (:func:`~fastlight.sampling.shared_cut.cycle_key`): it is truncated on the termination rate
        over the whole rank's clips. ``None``: on this Collector's own clips.

        ``cut_since``: with ``cut_requests``, their count when the sampler's round began: once the
        trainer has asked for more, the cycle ends after the step under way (every clip still
        running truncated and bootstrapped; in ``autoreset`` the segment ends there and its
        episodes go on) and ``stats.cut_in_flight`` is 1. ``None``: never cut on request.
        """
        if cut_since is not None and self.cut_requests is None:
            raise ValueError("collect(cut_since=...) needs a Collector built with cut_requests")
        self._cut_since = cut_since
        stats = RolloutStats()
        t0 = time.perf_counter()
        # Checked once per round, not per step (a Protocol isinstance walks its members).
        self._served = isinstance(policy, ServedPolicy)
        if self._served:  # the inference worker ranks stragglers by progress per round
            policy.new_round()
        self._chunk = action_chunk(policy.action_mapping())
        if self.mode in ("dpsa", "sgr"):
            shared = self.shared_cut if cut_key is not None else None
            rows = self._collect_cycle(policy, stats, shared, cut_key or 0)
        else:
            rows = self._collect_autoreset(policy, stats)
        rollout = RowBuffer.to_rollout(rows, policy_version=policy_version, stats=stats)
        if self._chunk is None:
            stats.raw_steps = rollout.valid.numel()
            stats.valid_steps = int(rollout.valid.sum())
        else:  # env steps, not chunks
            stats.raw_steps = rows.raw_env_steps()
            stats.valid_steps = rollout.num_env_steps
        # += : a global reset done ahead (reset_ahead) already put its seconds here.
        stats.wall_time += time.perf_counter() - t0
        return rollout

    def _should_truncate(
        self, n_ended: int, t: int, threshold: float, shared: SharedCutView | None = None, key: int = 0
    ) -> bool:
        if shared is None:
            if t >= self.max_horizon:
                return True
            if self.mode == "sgr":
                return n_ended >= 1
            # A small epsilon: k / E computed by the chooser must cut at k ended envs, not k + 1.
            return n_ended / self.num_envs >= threshold - 1e-9
        # FAST §DPSA's rate over all clips: this rank's samplers cut together.
        fraction = shared.ended_fraction(key, n_ended)
        if shared.was_cut(key):
            return True
        hit = t >= self.max_horizon or (fraction > 0 if self.mode == "sgr" else fraction >= threshold - 1e-9)
        if hit:
            shared.mark(key)
            return True
        # Every clip of this sampler has ended: nothing left here to truncate (the others go on).
        return n_ended == self.num_envs

    def _cut_requested(self) -> bool:
        """Whether the trainer asked, since this round began, for the round under way."""
        return (
            self._cut_since is not None
            and self.cut_requests is not None
            and self.cut_requests.count() > self._cut_since
        )

    def _collect_cycle(
        self, policy: Policy, stats: RolloutStats, shared: SharedCutView | None = None, key: int = 0
    ) -> RowBuffer:
        start = time.perf_counter()
        before = (stats.reset_time, stats.step_time)
        ahead_s = self._global_reset(stats)
        start -= ahead_s  # a reset done ahead still belongs to this cycle's costs
        stats.wall_time += ahead_s
        stats.global_resets += 1
        if shared is not None:
            shared.begin(key)
        threshold = self.chooser.threshold() if self.chooser is not None else self.termination_threshold
        stats.threshold_sum += float(threshold) if self.mode == "dpsa" else 0.0
        rows = RowBuffer(self.num_envs, self._chunk)
        alive = [True] * self.num_envs
        # t: the cycle's env-step time (policy steps x their chunks' span; one per step without chunks)
        t = env_steps = 0
        while True:
            active = [i for i in range(self.num_envs) if alive[i]]
            span = min(self._chunk or 1, self.max_horizon - t)  # the last chunk ends at max_horizon
            out = self._step_envs(policy, active, stats, span)
            env_steps += len(active) if self._chunk is None else sum(r.steps for r in out.results)
            row = rows.new_row(out, self._eps, active, span)
            for j, i in enumerate(active):
                if self._advance(row, i, out.results[j], rows, stats):
                    alive[i] = False
            t += span
            cut = self._should_truncate(self.num_envs - sum(alive), t, threshold, shared, key)
            requested = not cut and any(alive) and self._cut_requested()
            cut = cut or requested
            if cut:
                # Unified truncation: every env still running is cut here and bootstrapped.
                for i in range(self.num_envs):
                    if alive[i]:
                        row.set_truncated(i)
                        rows.episodes.append(
                            record(self._eps[i], terminated=False, truncated=True, info={}, cut=True)
                        )
            self._bootstrap(policy, row)
            if cut:
                stats.cut_in_flight += requested
                # A cut the trainer asked for says nothing about the threshold's costs.
                if self.chooser is not None and not requested:
                    reset_s, step_s = stats.reset_time - before[0], stats.step_time - before[1]
                    other_s = time.perf_counter() - start - reset_s - step_s
                    # rounds in env-step time: the chooser models a cycle's overhead per env step of
                    # its length (with chunks, one policy call per chunk is spread over its steps).
                    costs = CycleCosts(reset_s, step_s, max(other_s, 0.0), rounds=t, env_steps=env_steps)
                    # (length, ended) per env: an env still alive at the cut is censored at its length.
                    self.chooser.observe(
                        [(self._eps[i].step, not alive[i]) for i in range(self.num_envs)], costs
                    )
                return rows

    def _collect_autoreset(self, policy: Policy, stats: RolloutStats) -> RowBuffer:
        if self._obs is None:
            self._reset(range(self.num_envs), stats)
            stats.global_resets += 1
        rows = RowBuffer(self.num_envs, self._chunk)
        everyone = list(range(self.num_envs))
        chunk = self._chunk or 1
        policy_steps = -(-self.rollout_steps // chunk)  # ceil: rollout_steps counts env steps
        for t in range(policy_steps):
            span = min(chunk, self.rollout_steps - t * chunk)
            out = self._step_envs(policy, everyone, stats, span)
            row = rows.new_row(out, self._eps, everyone, span)
            requested = t < policy_steps - 1 and self._cut_requested()
            ended = []
            for i in everyone:
                if self._advance(row, i, out.results[i], rows, stats):
                    ended.append(i)
                elif t == policy_steps - 1 or requested:
                    # Rollout boundary: bootstrap, but the episode goes on in the next call.
                    row.set_truncated(i)
            self._bootstrap(policy, row)
            if ended:
                self._reset(ended, stats)
            if requested:
                stats.cut_in_flight += 1
                break
        return rows

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
            row.bootstrap[i] = float(values[j])


def _no_beat() -> None:
    pass
