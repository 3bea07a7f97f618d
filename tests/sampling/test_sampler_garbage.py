"""A sampler process collects the reference cycles its envs leave at every reset after each round
(issue 40 item 7: the dead highway-env roads of ~100 rounds piled up between Python's full
collections and grew the samplers' memory)."""

from __future__ import annotations

import time

import pytest

from fastlight.fleet.base import FleetBuild
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.pool import SamplerPool
from fastlight.models.mlp import MLPActorCritic
from fastlight.sampling.bundle import SamplerConfig

pytestmark = pytest.mark.multiproc
ENV = "tests.sampling.cyclic_env:CyclicGarbage-v0"


def test_a_samplers_cyclic_env_garbage_stays_bounded_over_rounds():
    num_envs, rounds = 2, 30
    config = SamplerConfig(env_id=ENV, num_envs=num_envs, max_horizon=8, termination_threshold=1.0, seed=0)
    net = MLPActorCritic(3, 2)
    pool = SamplerPool(
        FleetBuild([config], net, faults=FaultSettings(worker_timeout_s=120.0, max_worker_restarts=0))
    )
    pool.start()
    alive: list[int] = []
    try:
        for version in range(rounds):
            pool.publish(net, version)
            deadline = time.monotonic() + 60.0
            while (item := pool.next_item(0.2)) is None or int(item.policy_version.max()) != version:
                assert time.monotonic() < deadline, f"no item of version {version} within 60 s"
            alive.append(max(int(ep.info["roads_alive"]) for ep in item.stats.episodes))
    finally:
        pool.stop()
    # Every episode ends in its cycle (threshold 1.0), so each round resets every env once: its
    # current roads, and at most the last round's and the reset done ahead, not yet collected.
    assert max(alive) <= 3 * num_envs, alive
