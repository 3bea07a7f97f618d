"""Stepping E gymnasium envs into Rollouts under one of four reset modes (FAST §DPSA).

- ``dpsa``: an env that ends emits *dummy steps* (``valid=False``, observation frozen, reward 0,
  no simulator call) while the others keep going. A *unified truncation* (one global reset) happens
  when the fraction of ended envs reaches ``termination_threshold`` or after ``max_horizon`` steps;
  the still-running envs are marked ``truncated`` and bootstrapped. One ``collect()`` is one cycle.
- ``sgr``: Synchronous Global Reset, a global reset as soon as any env ends (``dpsa`` at ``1/E``).
- ``autoreset``: each env resets on its own when it ends; one ``collect()`` is ``rollout_steps`` steps.
- ``sequential``: ``autoreset`` over exactly one env, the baseline of FAST's speed-up table.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import gymnasium as gym
import torch

from fastlight.models.action_mapping import action_chunk
from fastlight.models.base import Policy, ServedPolicy
from fastlight.rollout import Rollout, RolloutStats
from fastlight.sampling.auto_threshold import AUTO, CycleCosts, ThresholdChooser
from fastlight.sampling.bundle import SamplerBundle
from fastlight.sampling.collector_settings import COLLECTOR_RANGES, RESET_MODES, check_ranges
from fastlight.sampling.episodes import Episode, record
from fastlight.sampling.exact import SamplerState, env_state, restore_env, seed_round
from fastlight.sampling.round_signal import RoundView, cycle_key, together_blockers
from fastlight.sampling.rows import RowBuffer
from fastlight.sampling.steps import EnvSteps


class Collector(EnvSteps):
    """Steps ``envs`` with a policy and returns one :class:`~fastlight.rollout.Rollout` per call.

    Args:
        envs: the E environments (``len(envs) == 1`` for ``sequential``).
        mode: the reset mode (:data:`~fastlight.sampling.collector_settings.RESET_MODES`).
        termination_threshold: DPSA's unified-truncation threshold on the fraction of ended envs,
            or ``"auto"`` (:class:`~fastlight.sampling.auto_threshold.ThresholdChooser`).
        max_horizon: cycle length cap in env steps; reaching it truncates and bootstraps.
        rollout_steps: env steps per env per ``collect()`` in the modes without cycles.
        seed: the sampler's base seed, of its global resets and its rounds' action noise.
        nonfinite: a NaN / inf observation or reward: ``raise`` (:class:`NonFiniteError`), or ``drop``:
            pad the episode out, counted in ``stats.dropped_nonfinite`` (a reset is retried).
        heartbeat: called after every env step and reset (the trainer's watch of a stuck sampler).
        save_envs: ``autoreset``: save the envs with :meth:`state` after every round.
        rounds: this sampler's view of its rank's :class:`~fastlight.sampling.round_signal.RoundSignal`.
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
        group_size: int = 1,
        nonfinite: str = "raise",
        heartbeat: Callable[[], None] | None = None,
        rounds: RoundView | None = None,
        save_envs: bool = False,
    ) -> None:
        check_ranges(dict(reset_mode=mode, num_envs=len(envs), termination_threshold=termination_threshold,
                          max_horizon=max_horizon, rollout_steps=rollout_steps, nonfinite=nonfinite),
                     COLLECTOR_RANGES)  # fmt: skip
        if RESET_MODES[mode].one_env and len(envs) != 1:
            raise ValueError(f"--data.num_envs must be 1 with --data.reset_mode {mode}, got {len(envs)}")
        if rounds is not None and rounds.shared_rate:  # the rank's rate: --data.max_staleness 0
            threshold = termination_threshold
            wrong = together_blockers(reset_mode=mode, max_staleness=0, termination_threshold=threshold,
                                      cycles_per_step=1)  # fmt: skip
            for flag, (value, allowed) in wrong.items():
                raise ValueError(f"the rank's termination rate (--data.rank_rounds together) needs {flag} "
                                 f"{allowed}, got {value!r}")  # fmt: skip
        self.nonfinite, self.save_envs, self.rounds = nonfinite, save_envs, rounds
        self.heartbeat = heartbeat if heartbeat is not None else lambda: None
        self.envs, self.mode, self.traits = list(envs), mode, RESET_MODES[mode]
        self.termination_threshold = termination_threshold
        auto = termination_threshold == AUTO and self.traits.threshold  # one chooser per Collector
        self.chooser = ThresholdChooser(len(self.envs), max_horizon, seed=seed) if auto else None
        self.max_horizon, self.rollout_steps, self.seed = max_horizon, rollout_steps, seed
        if group_size < 1 or len(self.envs) % group_size or (group_size > 1 and not self.traits.cycles):
            cycled = " or ".join(m for m, traits in RESET_MODES.items() if traits.cycles)
            raise ValueError(
                f"--data.group_size {group_size} must be >= 1, divide each sampler's envs ({len(self.envs)}) "
                f"and, above 1, run with --data.reset_mode {cycled} (groups start together), got {mode}"
            )
        self.group_size = group_size
        self._pool = ThreadPoolExecutor(max_workers=len(self.envs), thread_name_prefix="fastlight-reset")
        #: Global resets and rounds done: the next ones' seeds (:mod:`fastlight.sampling.exact`).
        self.resets = self.rounds_done = 0
        self._obs: list[Any] | None = None  # current observation of each env (autoreset carry-over)
        self._eps: list[Episode] = []
        self._seeds: list[int | None] = [None] * len(self.envs)  # each env's last reset seed, for its errors
        self._served = False
        self._chunk: int | None = None
        self.reset_cost: float | None = None  # running mean of one env.reset() in seconds, once timed
        # The next cycle's global reset, done ahead by reset_ahead(): its counters and wall seconds.
        self._ahead: tuple[RolloutStats, float] | None = None

    @classmethod
    def for_sampler(cls, bundle: SamplerBundle) -> Collector:
        """The Collector a sampler runs: its config's envs, its bundle's heartbeat and round signal."""
        cfg = bundle.config
        return cls(
            cfg.build_envs(),
            mode=cfg.reset_mode,
            termination_threshold=cfg.termination_threshold,
            max_horizon=cfg.max_horizon,
            rollout_steps=cfg.rollout_steps,
            seed=cfg.seed,
            group_size=cfg.group_size,
            nonfinite=cfg.nonfinite,
            heartbeat=bundle.beat,
            rounds=bundle.rounds,
            save_envs=cfg.exact_resume,
        )

    def begin_round(self) -> None:
        """Reseed the action noise for the next round (see :func:`~fastlight.sampling.exact.seed_round`)."""
        seed_round(self.seed, self.rounds_done)
        self.rounds_done += 1

    def state(self, version: int) -> SamplerState:
        """This sampler's position after the round it ran on ``version`` (:mod:`fastlight.sampling.exact`)."""
        state = SamplerState(version, self.rounds_done, self.resets)
        if self.traits.cycles or self._obs is None:  # every episode ends with its cycle
            return state
        envs = [env_state(env) for env in self.envs] if self.save_envs else [None]
        if any(e is None for e in envs):  # not saved (--data.exact_resume false), or not savable
            return replace(state, exact=False)
        return replace(state, envs=pickle.dumps((envs, self._obs, self._eps)))

    def restore(self, state: SamplerState) -> None:
        """Go on from ``state`` (a checkpoint's, for this sampler's index and settings)."""
        self.rounds_done, self.resets = state.rounds, state.resets
        self.discard_ahead()  # a reset done ahead before the restore used the wrong seeds
        if state.envs is not None:
            envs, self._obs, self._eps = pickle.loads(state.envs)
            self.envs = [restore_env(env, s) for env, s in zip(self.envs, envs, strict=True)]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for env in self.envs:
            env.close()

    @torch.no_grad()
    def collect(self, policy: Policy, *, policy_version: int = 0, cycle: int | None = None) -> Rollout:
        """One sampling cycle (a mode with cycles) or ``rollout_steps`` steps (the others).

        ``cycle``: with ``rounds``, which of the training step's cycles this is (0 begins the round):
        strictly on-policy it is truncated on the rank's termination rate; asynchronous, it ends when
        the trainer asks for the round (``stats.cut_in_flight`` 1). ``None``: a cycle of its own.
        """
        if cycle == 0 and self.rounds is not None:
            self.rounds.start_round()
        stats = RolloutStats()
        t0 = time.perf_counter()
        # Checked once per round, not per step (a Protocol isinstance walks its members).
        self._served = isinstance(policy, ServedPolicy)
        if self._served:  # the inference worker ranks stragglers by progress per round
            policy.new_round(self.heartbeat)
        self._chunk = action_chunk(policy.action_mapping())
        if self.traits.cycles:
            rank_rate = cycle is not None and self.rounds is not None and self.rounds.shared_rate
            rows = self._collect_cycle(policy, stats, cycle_key(policy_version, cycle) if rank_rate else None)
        else:
            rows = self._collect_autoreset(policy, stats)
        rollout = rows.to_rollout(policy_version=policy_version, stats=stats)
        if self._chunk is None:
            stats.raw_steps = rollout.valid.numel()
            stats.valid_steps = int(rollout.valid.sum())
        else:  # env steps, not chunks
            stats.raw_steps = rows.raw_env_steps()
            stats.valid_steps = rollout.num_env_steps
        # += : a global reset done ahead (reset_ahead) already put its seconds here.
        stats.wall_time += time.perf_counter() - t0
        return rollout

    def _reached(self, fraction: float, threshold: float) -> bool:
        """Whether a cycle with ``fraction`` of its clips ended is truncated (the termination rate)."""
        if not self.traits.threshold:
            return fraction > 0
        # A small epsilon: k / E computed by the chooser must cut at k ended envs, not k + 1.
        return fraction >= threshold - 1e-9

    def _should_truncate(self, n_ended: int, t: int, threshold: float, key: int | None) -> bool:
        if key is None:
            return t >= self.max_horizon or self._reached(n_ended / self.num_envs, threshold)
        # FAST §DPSA's rate over all clips: this rank's samplers cut together.
        assert self.rounds is not None
        if self.rounds.rank_cut(key, n_ended, lambda fraction: self._reached(fraction, threshold)):
            return True
        # max_horizon counts this sampler's own env steps, so it ends this sampler's cycle only.
        return n_ended == self.num_envs or t >= self.max_horizon

    def _cut_asked(self) -> bool:
        """Whether the trainer asked, since this round began, for the round under way."""
        return self.rounds is not None and self.rounds.cut_asked()

    def _collect_cycle(self, policy: Policy, stats: RolloutStats, key: int | None) -> RowBuffer:
        """One dpsa/sgr cycle (``key``: its rank-wide key, or None for this sampler's own rate)."""
        start = time.perf_counter()
        before = (stats.reset_time, stats.step_time)
        ahead_s = self._global_reset(stats)
        start -= ahead_s  # a reset done ahead still belongs to this cycle's costs
        stats.wall_time += ahead_s
        stats.global_resets += 1
        if key is not None:
            self.rounds.begin(key)
        threshold = self.chooser.threshold() if self.chooser is not None else self.termination_threshold
        stats.threshold_sum += float(threshold) if self.traits.threshold else 0.0
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
            cut = self._should_truncate(self.num_envs - sum(alive), t, threshold, key)
            requested = not cut and any(alive) and self._cut_asked()
            cut = cut or requested
            if cut:  # unified truncation: every env still running is cut here and bootstrapped
                for i in [i for i, a in enumerate(alive) if a]:
                    row.set_truncated(i)
                    ep = record(self._eps[i], terminated=False, truncated=True, info={}, cut=True)
                    rows.episodes.append(ep)
            self._bootstrap(policy, row)
            if cut:
                stats.cut_in_flight += requested
                # A cut the trainer asked for says nothing about the threshold's costs.
                if self.chooser is not None and not requested:
                    self._observe_costs(stats, before, start, alive, t, env_steps)
                return rows

    def _observe_costs(
        self, stats: RolloutStats, before: tuple[float, float], start: float, alive: list[bool], t: int,
        env_steps: int,
    ) -> None:  # fmt: skip
        """Feed the ``auto`` threshold's chooser this cycle's costs and episode lengths."""
        assert self.chooser is not None
        reset_s, step_s = stats.reset_time - before[0], stats.step_time - before[1]
        other_s = time.perf_counter() - start - reset_s - step_s
        # rounds in env-step time: with chunks, one policy call's overhead is spread over its steps.
        costs = CycleCosts(reset_s, step_s, max(other_s, 0.0), rounds=t, env_steps=env_steps)
        # (length, ended) per env: an env still alive at the cut is censored at its length.
        self.chooser.observe([(self._eps[i].step, not alive[i]) for i in range(self.num_envs)], costs)

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
            requested = t < policy_steps - 1 and self._cut_asked()
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
