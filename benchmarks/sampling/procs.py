"""The sampling benchmark on fastlight's real path: a :class:`RolloutDataModule` with its sampler
processes, driven by a fixed random policy and no network, so that a cell measures what a user's
training run gets from sampling (FAST §effective throughput) rather than one process's ceiling.

The loop is the trainer's, minus the update: take a super-batch (one item per sampler), bump the
policy version and publish it, which lets the strictly on-policy samplers start their next round.
Rates use the trainer-side wall clock between batches (as ``RolloutThroughput`` does); the first
batch is a warm-up (process start, imports, first resets) and is not counted.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import gymnasium as gym
import torch
from torch import Tensor, nn

from benchmarks.sampling.runs import MAX_HORIZON, BenchEnv, RunSpec, RunTotals
from fastlight.data.datamodule import RolloutDataModule
from fastlight.envs.scenario_cost import ScenarioLoadCost
from fastlight.fleet.faults import FaultSettings
from fastlight.models.action_mapping import IdentityActions
from fastlight.models.base import ActionMapping, ActOutput, EvalOutput, Obs

#: Steps per round in autoreset / sequential, per env: one round of 10 envs is then as many
#: transitions as a few DPSA cycles, so no mode waits much longer than another between batches.
AUTORESET_STEPS = 32


def _batch(obs: Obs) -> int:
    return int(next(iter(obs.values())).shape[0] if isinstance(obs, dict) else obs.shape[0])


class SpaceRandomPolicy(nn.Module):
    """Samples the env's own action space: uniform over a ``Discrete``'s actions, uniform in a
    bounded ``Box`` (a standard normal on unbounded axes). Values are 0 and log-probs constant: it
    has no weights, so it costs next to nothing and the runs measure sampling, not inference.

    It draws from torch's global RNG, which every sampler process seeds from its env seed.
    """

    def __init__(self, action_space: gym.Space) -> None:
        super().__init__()
        if isinstance(action_space, gym.spaces.Discrete):
            self.n: int | None = int(action_space.n)
            self.start = int(action_space.start)
            self.shape: tuple[int, ...] = ()
            self.logp = -math.log(self.n)
        elif isinstance(action_space, gym.spaces.Box):
            self.n = None
            self.shape = tuple(action_space.shape)
            low = torch.as_tensor(action_space.low, dtype=torch.float32)
            high = torch.as_tensor(action_space.high, dtype=torch.float32)
            self.bounded = torch.isfinite(low) & torch.isfinite(high)
            self.low = torch.where(self.bounded, low, torch.zeros_like(low))
            self.width = torch.where(self.bounded, high - low, torch.ones_like(low))
            self.logp = -float(torch.log(self.width[self.bounded]).sum())
        else:
            raise ValueError(f"--env must have a Discrete or Box action space, got {action_space}")

    def act(self, obs: Obs, *, step: Tensor | None = None, deterministic: bool = False) -> ActOutput:
        b = _batch(obs)
        if self.n is not None:
            actions = torch.randint(self.n, (b,)) + self.start
        else:
            u = self.low + self.width * torch.rand((b, *self.shape))
            actions = torch.where(self.bounded, u, torch.randn((b, *self.shape)))
        return ActOutput(actions, torch.full((b,), self.logp), torch.zeros(b))

    def evaluate(self, obs: Obs, actions: Tensor, *, step: Tensor | None = None) -> EvalOutput:
        b = _batch(obs)
        return EvalOutput(torch.full((b,), self.logp), torch.full((b,), -self.logp), torch.zeros(b))

    def value(self, obs: Obs, *, step: Tensor | None = None) -> Tensor:
        return torch.zeros(_batch(obs))

    def action_mapping(self) -> ActionMapping:
        return IdentityActions()

    def env_action(self, actions: Tensor) -> Tensor:
        return actions


@dataclass
class FixedPolicy:
    """The :class:`~fastlight.data.protocols.TrainsPolicy` the DataModule samples with: a policy
    that never learns, whose version the benchmark bumps once per batch as an update would."""

    policy: nn.Module
    policy_version: int = 0
    optimizer_steps_per_update: int = 1


def default_workers() -> int:
    """One sampler process per core this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def build_datamodule(spec: RunSpec, be: BenchEnv, *, workers: int, seed: int) -> RolloutDataModule:
    """The cell's DataModule: ``sequential`` is one env in one process; other modes spread
    ``spec.clips`` envs over ``min(workers, clips)`` processes."""
    num_envs = 1 if spec.mode == "sequential" else spec.clips
    return RolloutDataModule(
        env_id=be.env_id,
        env_kwargs={"disable_env_checker": True},
        num_envs=num_envs,
        num_workers=min(workers, num_envs),
        reset_mode=spec.mode,
        termination_threshold=spec.threshold if spec.threshold is not None else 0.5,
        max_horizon=MAX_HORIZON,
        rollout_steps=AUTORESET_STEPS,
        env_wrappers=[ScenarioLoadCost(be.reset_cost_s)] if spec.setting == "emulated_reset" else None,
        seed=seed,
        prefetch=1,
        faults=FaultSettings(worker_timeout_s=120.0),
        rank_rounds="apart",  # each process's clips alone, as the recorded tables were measured
    )


def run_procs(
    spec: RunSpec, be: BenchEnv, *, valid_steps: int, seed: int, totals: RunTotals, workers: int
) -> None:
    """Take super-batches from the cell's sampler processes until ``valid_steps`` valid ones."""
    if spec.setting == "shared_sim":
        raise ValueError("--settings shared_sim is an in-process emulation: use it with --path single")
    dm = build_datamodule(spec, be, workers=workers, seed=seed)
    probe = gym.make(be.env_id, disable_env_checker=True)
    owner = FixedPolicy(SpaceRandomPolicy(probe.action_space))
    probe.close()
    prefetcher = None
    try:
        dm.start(owner)
        prefetcher = dm.prefetcher
        timeout = dm.faults.worker_timeout_s
        dm.publish(owner)
        prefetcher.get(timeout=timeout)  # warm-up: spawn, imports, first resets
        got = 0
        while got < valid_steps:
            owner.policy_version += 1
            t0 = time.perf_counter()
            dm.publish(owner)
            stats = prefetcher.get(timeout=timeout).stats
            totals.metric.update(stats, elapsed=time.perf_counter() - t0)
            # What the learner receives: in dpsa/sgr every episode, cut ones at their cut length;
            # in autoreset/sequential the episodes that ended (see the report's note on the tail).
            totals.lengths.extend(ep.length for ep in stats.episodes)
            if spec.mode in ("sequential", "autoreset"):
                totals.complete.extend((ep.length, ep.terminated) for ep in stats.episodes)
            got += stats.valid_steps
    finally:
        dm.stop()
