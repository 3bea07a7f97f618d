"""One run of the sampling benchmark: a :class:`~fastlight.sampling.collector.Collector` over E
envs stepped by a fixed random policy, until a target number of *valid* transitions.

Three settings (FAST §Problem Definition, §execution time):

- ``native``: real environment stepping, the environment's own reset;
- ``emulated_reset``: real stepping, every env reset also sleeps ``reset_cost_s``
  (:class:`~fastlight.envs.scenario_cost.ScenarioLoadCost`; the resets of one sampler overlap);
- ``shared_sim``: FAST's shared simulator, fully emulated (:mod:`benchmarks.sampling.shared_sim`):
  serialised scenario reloads, clips stepping in parallel, only global resets (no autoreset).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor, nn

from benchmarks.sampling.shared_sim import shared_sim_clips
from fastlight.envs.registry import make_env
from fastlight.envs.scenario_cost import ScenarioLoadCost
from fastlight.metrics.throughput import ThroughputMetrics
from fastlight.models.action_mapping import IdentityActions
from fastlight.models.base import ActionMapping, ActOutput, EvalOutput, Obs
from fastlight.sampling.collector import Collector

SETTINGS = ("native", "emulated_reset", "shared_sim")
#: Cycle cap for dpsa/sgr; above highway-fast-v0's 30-step time limit, so it never binds there.
MAX_HORIZON = 200
#: Steps per ``collect()`` in autoreset/sequential mode: ``max(1, AUTORESET_SLOTS // clips)``,
#: so that one collect overshoots the valid-step target by at most ~64 transitions.
AUTORESET_SLOTS = 64


class RandomPolicy(nn.Module):
    """A fixed policy: uniform random discrete actions (seeded), log-prob ``-log n``, values 0.

    It costs next to nothing, so the benchmark measures sampling, not inference.
    """

    def __init__(self, num_actions: int, *, seed: int = 0) -> None:
        super().__init__()
        if num_actions < 1:
            raise ValueError(f"RandomPolicy needs num_actions >= 1, got {num_actions}")
        self.num_actions = num_actions
        self.generator = torch.Generator().manual_seed(seed)

    @staticmethod
    def _n(obs: Obs) -> int:
        return int(next(iter(obs.values())).shape[0] if isinstance(obs, dict) else obs.shape[0])

    def act(self, obs: Obs, *, step: Tensor | None = None, deterministic: bool = False) -> ActOutput:
        n = self._n(obs)
        actions = torch.randint(self.num_actions, (n,), generator=self.generator)
        return ActOutput(actions, torch.full((n,), -math.log(self.num_actions)), torch.zeros(n))

    def evaluate(self, obs: Obs, actions: Tensor, *, step: Tensor | None = None) -> EvalOutput:
        n = self._n(obs)
        logp = torch.full((n,), -math.log(self.num_actions))
        return EvalOutput(logp, torch.full((n,), math.log(self.num_actions)), torch.zeros(n))

    def value(self, obs: Obs, *, step: Tensor | None = None) -> Tensor:
        return torch.zeros(self._n(obs))

    def action_mapping(self) -> ActionMapping:
        return IdentityActions()

    def env_action(self, actions: Tensor) -> Tensor:
        return actions


@dataclass(frozen=True)
class RunSpec:
    """One cell of the benchmark matrix."""

    setting: str
    mode: str
    clips: int
    threshold: float | None = None

    def canonical(self) -> RunSpec:
        """The run that executes the same code path. At one clip, ``autoreset`` *is*
        ``sequential`` and ``dpsa`` at any threshold in (0, 1] *is* ``sgr`` (the cycle ends at
        the first termination), so each is measured once."""
        if self.clips == 1 and self.mode == "autoreset":
            return RunSpec(self.setting, "sequential", 1)
        if self.clips == 1 and self.mode == "dpsa" and (self.threshold or 0.0) > 0.0:
            return RunSpec(self.setting, "sgr", 1)
        return self


@dataclass
class BenchEnv:
    """What every run needs to build its envs."""

    env_id: str
    reset_cost_s: float
    shared_step_s: float = 0.0
    #: ``(length, terminated)`` of complete real episodes, replayed by the shared simulator.
    episode_pool: list[tuple[int, bool]] = field(default_factory=list)
    observation_space: gym.spaces.Space | None = None
    action_space: gym.spaces.Space | None = None


@dataclass
class RunTotals:
    """Everything measured for one spec, summed over rounds.

    ``lengths`` are the trajectories the learner receives: in ``dpsa``/``sgr`` every episode of
    every cycle, one cut by a unified truncation at its cut length (FAST's short-time bias);
    in ``autoreset``/``sequential`` every episode whole, since episodes carry over between
    rollouts - the ones still running when a run stops are stepped to their end untimed
    (:func:`drain`), otherwise stopping would drop the longest ones. ``complete`` holds
    ``(length, terminated)`` of those natural episodes (the shared simulator's pool).
    """

    metric: ThroughputMetrics = field(default_factory=ThroughputMetrics)
    lengths: list[int] = field(default_factory=list)
    complete: list[tuple[int, bool]] = field(default_factory=list)


class EpisodeLengths(gym.Wrapper):
    """Records ``(length, terminated)`` of every episode that ends by itself."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.ended: list[tuple[int, bool]] = []
        self.t = 0
        self.running = False

    def reset(self, **kwargs: Any):
        self.t, self.running = 0, True  # a running episode reset here was cut by the sampler
        return self.env.reset(**kwargs)

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        if terminated or truncated:
            self.ended.append((self.t, bool(terminated)))
            self.running = False
        return obs, reward, terminated, truncated, info


def drain(envs: list[EpisodeLengths], seed: int) -> None:
    """Step every still-running episode to its end with random actions (untimed, lengths only).

    An env that autoreset just before the run stopped is played through too: one more episode
    that did not start later because it is long, so the length sample stays unbiased.
    """
    for env in envs:
        env.action_space.seed(seed)
        while env.running:
            env.step(env.action_space.sample())


def _real_env(be: BenchEnv) -> gym.Env:
    return make_env(be.env_id, env_kwargs={"disable_env_checker": True}, flag="--env")


def build_envs(spec: RunSpec, be: BenchEnv) -> list[gym.Env]:
    """The spec's envs: real ones (+ emulated scenario loading) or shared-simulator clips."""
    num = 1 if spec.mode == "sequential" else spec.clips
    if spec.setting == "shared_sim":
        if not be.episode_pool or be.observation_space is None or be.action_space is None:
            raise ValueError("shared_sim needs an episode pool measured on the real env first")
        return list(
            shared_sim_clips(
                num, be.episode_pool, step_s=be.shared_step_s, reset_s=be.reset_cost_s,
                observation_space=be.observation_space, action_space=be.action_space,
            )
        )
    envs = [_real_env(be) for _ in range(num)]
    if be.observation_space is None:
        be.observation_space, be.action_space = envs[0].observation_space, envs[0].action_space
    if spec.setting == "emulated_reset":
        envs = [ScenarioLoadCost(seconds=be.reset_cost_s).wrap(e) for e in envs]
    return envs


def run_spec(spec: RunSpec, be: BenchEnv, *, valid_steps: int, seed: int, totals: RunTotals) -> None:
    """Collect whole cycles (or autoreset chunks) until ``valid_steps`` valid transitions."""
    envs = [EpisodeLengths(e) for e in build_envs(spec, be)]
    action_space = envs[0].action_space
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"--env must have a discrete action space, got {action_space}")
    collector = Collector(
        envs, mode=spec.mode, termination_threshold=spec.threshold if spec.threshold is not None else 0.5,
        max_horizon=MAX_HORIZON, rollout_steps=max(1, AUTORESET_SLOTS // len(envs)), seed=seed,
    )
    policy = RandomPolicy(int(action_space.n), seed=seed)
    carry_over = spec.mode in ("sequential", "autoreset")
    try:
        got = 0
        while got < valid_steps:
            stats = collector.collect(policy).stats
            totals.metric.update(stats)  # one sampler: the rate clock is its own wall time
            if not carry_over:
                totals.lengths.extend(ep.length for ep in stats.episodes)
            got += stats.valid_steps
        if carry_over:
            drain(envs, seed)
            ended = [ep for env in envs for ep in env.ended]
            totals.complete.extend(ended)
            totals.lengths.extend(n for n, _ in ended)
    finally:
        collector.close()
