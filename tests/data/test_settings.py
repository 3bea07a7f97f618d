"""Each RolloutDataModule setting changes what the samplers do (checked in-process, no spawn)."""

from __future__ import annotations

import multiprocessing as mp
import threading
from time import sleep as real_sleep
from types import SimpleNamespace

import torch

from fastlight.data.datamodule import RolloutDataModule
from fastlight.envs import ScenarioLoadCost, scenario_cost
from fastlight.procs import seed_everything
from fastlight.rollout import Rollout
from fastlight.sampling.bundle import RankHandles
from fastlight.sampling.collector import Collector
from fastlight.sampling.resets import POOL_RESET_S
from tests.policies import ObsValuePolicy

FIXED = "tests.fake_envs:FixedLength-v0"


def sample(dm: RolloutDataModule, worker: int = 0, rank: int = 0, policy=None) -> Rollout:
    """What sampler ``worker`` of ``rank`` pushes for one step (the process's Collector, built from its
    bundle; the cycles are its own: no other sampler runs)."""
    configs = dm.sampler_configs(rank)
    cfg = configs[worker]
    seed_everything(cfg.seed)
    policy = policy or ObsValuePolicy()
    handles = RankHandles(mp.get_context("spawn"), configs)
    c = Collector.for_sampler(
        handles.bundle(worker, cfg, policy=policy, weights=None, beat=lambda: None, stop=threading.Event())
    )
    return Rollout.cat([c.collect(policy) for _ in range(cfg.cycles_per_step)], dim=0)


def test_num_envs_are_spread_over_workers_and_seeds_offset_by_rank():
    dm = RolloutDataModule(env_id=FIXED, num_envs=5, num_workers=2, seed=3)
    assert [c.num_envs for c in dm.sampler_configs(0)] == [3, 2]
    assert [c.seed for c in dm.sampler_configs(0)] == [3, 1003]
    assert [c.seed for c in dm.sampler_configs(1)] == [10003, 11003]


def test_cycles_per_step_joins_cycles_in_time():
    one = sample(RolloutDataModule(env_id=FIXED, env_kwargs={"lengths": (4,)}, num_envs=2, num_workers=1))
    two = sample(
        RolloutDataModule(
            env_id=FIXED, env_kwargs={"lengths": (4,)}, num_envs=2, num_workers=1, cycles_per_step=2
        )
    )
    assert one.shape == (4, 2) and two.shape == (8, 2)
    assert two.stats.global_resets == 2


def test_max_horizon_reaches_the_collector():
    kw = {"env_id": FIXED, "env_kwargs": {"lengths": (9,)}, "num_envs": 2, "num_workers": 1}
    assert sample(RolloutDataModule(**kw)).shape[0] == 9
    r = sample(RolloutDataModule(**kw, max_horizon=5))
    assert r.shape[0] == 5 and r.truncated[-1].all()


def test_reset_mode_and_rollout_steps():
    r = sample(
        RolloutDataModule(
            env_id=FIXED,
            env_kwargs={"lengths": (2,)},
            num_envs=2,
            num_workers=1,
            reset_mode="autoreset",
            rollout_steps=7,
        )
    )
    assert r.shape == (7, 2) and r.valid.all() and int(r.terminated.sum()) == 6


def test_scenario_load_cost_loads_on_every_reset_and_the_loads_overlap(monkeypatch):
    # No clock: each emulated load records its duration and waits at a 2-party barrier, so the
    # two envs' loads only get through if they run at the same time (else BrokenBarrierError).
    barrier, loads = threading.Barrier(2, timeout=30), []  # the timeout only guards against a hang

    def load(seconds: float) -> None:
        loads.append(seconds)
        barrier.wait()
        # A real load takes time: the Collector keeps resets on its pool only while one costs more
        # than POOL_RESET_S (cheaper ones run inline), so the emulated one must too.
        real_sleep(2 * POOL_RESET_S)

    kw = {
        "env_id": FIXED,
        "env_kwargs": {"lengths": (3,)},
        "num_envs": 2,
        "num_workers": 1,
        "cycles_per_step": 2,
    }
    plain = RolloutDataModule(**kw)
    # Built before the clock is replaced: the probe env (one reset) wears the env wrappers too.
    loaded = RolloutDataModule(**kw, env_wrappers=[ScenarioLoadCost(seconds=0.2)])
    assert loaded.sampler_configs(0)[0].env_wrappers == (ScenarioLoadCost(seconds=0.2),)
    monkeypatch.setattr(scenario_cost, "time", SimpleNamespace(sleep=load))
    fast = sample(plain)
    assert loads == []  # no load cost: no emulated loading
    slow = sample(loaded)
    assert slow.stats.global_resets == 2
    assert loads == [0.2] * 4  # 2 global resets x 2 envs, each env's load overlapping the other's
    # Loading costs time only: the data are the same.
    assert slow.shape == fast.shape == (6, 2)
    assert torch.equal(slow.obs, fast.obs) and torch.equal(slow.terminated, fast.terminated)


def test_seed_changes_the_data():
    from fastlight.models.mlp import MLPActorCritic

    kw = {"env_id": "highway-fast-v0", "num_envs": 1, "num_workers": 1, "max_horizon": 3}
    policy = MLPActorCritic(25, 5)
    a, b = (sample(RolloutDataModule(**kw, seed=s), policy=policy) for s in (0, 1))
    a2 = sample(RolloutDataModule(**kw, seed=0), policy=policy)
    assert torch.equal(a.obs, a2.obs) and not torch.equal(a.obs[0], b.obs[0])


def test_steps_per_epoch_sets_the_epoch_length():
    dm = RolloutDataModule(env_id=FIXED, num_envs=1, num_workers=1, steps_per_epoch=7)
    assert len(dm.train_dataloader()) == 7


def test_env_seed_follows_the_global_seed_unless_data_seed_is_set(monkeypatch):
    import lightning as L

    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    derived = RolloutDataModule(env_id=FIXED, num_envs=2, num_workers=2)  # --data.seed left at None
    explicit = RolloutDataModule(env_id=FIXED, num_envs=2, num_workers=2, seed=3)
    assert derived.hparams.seed is None
    assert [c.seed for c in derived.sampler_configs(0)] == [0, 1000]  # no global seed: 0, as before
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # so that the test's end restores the variable
    for global_seed in (7, 8):  # a --seed_everything sweep now moves the env seeds too
        L.seed_everything(global_seed)
        assert [c.seed for c in derived.sampler_configs(0)] == [global_seed, global_seed + 1000]
        assert [c.seed for c in derived.sampler_configs(1)] == [global_seed + 10_000, global_seed + 11_000]
        assert [c.seed for c in explicit.sampler_configs(0)] == [3, 1003]  # --data.seed wins


def test_global_seed_changes_the_data_and_repeats_it(monkeypatch):
    import lightning as L

    from fastlight.models.mlp import MLPActorCritic

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # restored at the end of the test

    kw = {"env_id": "highway-fast-v0", "num_envs": 1, "num_workers": 1, "max_horizon": 3}
    policy = MLPActorCritic(25, 5)
    dm = RolloutDataModule(**kw)
    obs = []
    for s in (1, 2, 1):
        L.seed_everything(s)
        obs.append(sample(dm, policy=policy).obs)
    assert torch.equal(obs[0], obs[2]) and not torch.equal(obs[0][0], obs[1][0])
