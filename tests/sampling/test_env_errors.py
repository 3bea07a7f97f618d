"""An env that goes wrong is named: which env, its index in the sampler, its seed, the episode step.

An observation of another shape than the others (numpy alone says "all input arrays must have the
same shape"), and an exception raised inside ``env.step`` in a real sampler process (a SamplerError
whose first line names the env, not only the sampler).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import fastlight.sampling.obs as obs_module
from fastlight.envs.registry import make_env
from fastlight.fleet.base import FleetBuild
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.pool import SamplerError, SamplerPool
from fastlight.models.mlp import MLPActorCritic
from fastlight.sampling.bundle import SamplerConfig
from fastlight.sampling.collector import Collector
from fastlight.sampling.env_faults import EnvError
from fastlight.sampling.exact import reset_seed
from fastlight.sampling.obs import ObservationShapeError, stack_obs
from tests.lightning_helpers import wait_no_children
from tests.sampling import error_envs

ODD = "tests.sampling.error_envs:OddShape-v0"
RAISING = "tests.sampling.error_envs:Raising-v0"


def odd_envs(monkeypatch, n: int, **kwargs) -> list:
    monkeypatch.setattr(error_envs.OddShapeEnv, "made", 0)  # instance k is the sampler's env k
    return [make_env(ODD, env_kwargs=kwargs) for _ in range(n)]


def test_an_odd_observation_names_env_index_seed_step_and_shapes(monkeypatch):
    envs = odd_envs(monkeypatch, 3, bad_instance=1, bad_step=2)
    collector = Collector(envs, mode="dpsa", max_horizon=50, seed=7)
    with pytest.raises(ObservationShapeError) as e:
        collector.collect(MLPActorCritic(3, 2))
    assert str(e.value) == (
        "env OddShape-v0 (index 1 of this sampler, seed 8) returned an observation of shape (4,) at "
        "episode step 2; the others have shape (3,) (its observation_space: Box(-inf, inf, (3,), float32))"
    )
    assert "all input arrays must have the same shape" in str(e.value.__cause__)  # numpy's, kept as cause
    assert (e.value.index, e.value.shape, e.value.others) == (1, "(4,)", "(3,)")


def test_the_observation_space_decides_which_of_two_is_odd_in_the_bootstrap(monkeypatch):
    # Two envs, one shape each: the odd one is the one off its observation space (env 0 here), also
    # when the shapes first meet in the bootstrap of a cycle cut at max_horizon 2.
    envs = odd_envs(monkeypatch, 2, bad_instance=0, bad_step=2)
    collector = Collector(envs, mode="dpsa", max_horizon=2, seed=100)
    said = (
        r"^env OddShape-v0 \(index 0 of this sampler, seed 100\) returned an observation of shape \(4,\) "
        r"at episode step 2; the others have shape \(3,\)"
    )
    with pytest.raises(ObservationShapeError, match=said):
        collector.collect(MLPActorCritic(3, 2))


def test_stacking_looks_for_the_odd_one_only_once_it_failed(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("odd_observation ran on observations that stack")

    monkeypatch.setattr(obs_module, "odd_observation", never)
    envs = odd_envs(monkeypatch, 2, bad_instance=5)  # no such instance: every observation is (3,)
    rollout = Collector(envs, mode="dpsa", max_horizon=8, seed=0).collect(MLPActorCritic(3, 2))
    assert rollout.valid.shape == (5, 2)  # 5-step episodes, both ended at step 5
    dicts = stack_obs([{"a": [1.0, 2.0]}, {"a": [3.0, 4.0]}])
    assert dicts["a"].tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_a_dict_observation_names_the_key_layouts(monkeypatch):
    with pytest.raises(
        ObservationShapeError,
        match=r"observation 2 of 3 has shape \{'image': \(2, 2\)\}; "
        r"the others have shape \{'image': \(3, 3\)\}",
    ):
        stack_obs([{"image": [[0] * 3] * 3}, {"image": [[0] * 3] * 3}, {"image": [[0] * 2] * 2}])


@pytest.mark.multiproc
def test_an_env_that_keeps_raising_spends_the_restart_budget_naming_env_index_seed_and_step():
    # The sampler's env 1 (seed 1000 + 1) raises in the 3rd step of its first episode, in every process.
    env_kwargs = {"bad_instance": 1, "bad_step": 3}
    configs = [SamplerConfig(env_id=RAISING, num_envs=2, max_horizon=8, seed=1000, env_kwargs=env_kwargs)]
    net = MLPActorCritic(3, 2)
    faults = FaultSettings(worker_timeout_s=60, max_worker_restarts=2)
    pool = SamplerPool(FleetBuild(configs, net, faults=faults))
    pool.start()
    try:
        pool.publish(net, 0)
        with pytest.raises(SamplerError) as e:
            for _ in range(300):
                pool.next_item(0.2)
    finally:
        pool.stop()
    (line,) = str(e.value).splitlines()  # one line: the env's error and the spent budget
    assert line.startswith("sampler 0 (fastlight-sampler-0")
    assert line.endswith(
        "crashed: EnvError: env Raising-v0 (index 1 of this sampler, seed 1001) raised RuntimeError at "
        "episode step 3: the simulator lost its road network; restart budget exhausted: 2 restarts in the "
        "last 600 s (--data.faults.max_worker_restarts 2 per --data.faults.restart_window_s 600)"
    )
    wait_no_children()


def test_an_env_that_raises_once_is_restarted_and_the_run_goes_on(tmp_path, capsys):
    """A simulator that throws now and then: its sampler is restarted within the budget, in one line."""
    env_kwargs = {"bad_instance": 1, "bad_step": 3, "flag_dir": str(tmp_path)}
    flaky = "tests.sampling.error_envs:Flaky-v0"
    configs = [SamplerConfig(env_id=flaky, num_envs=2, max_horizon=8, seed=1000, env_kwargs=env_kwargs)]
    net = MLPActorCritic(3, 2)
    pool = SamplerPool(FleetBuild(configs, net, faults=FaultSettings(worker_timeout_s=60)))
    pool.start()
    try:
        pool.publish(net, 0)
        got = []
        for _ in range(600):
            item = pool.next_item(0.2)
            if item is not None:
                got.append(item)
                pool.publish(net, len(got))  # on-policy: the next round waits for the next version
            if len(got) >= 3:
                break
    finally:
        pool.stop()
    assert (tmp_path / "raised").exists() and len(got) >= 3  # it raised, and rounds came after it
    err = capsys.readouterr().err
    assert "crashed: EnvError: env Flaky-v0 (index 1 of this sampler, seed 1001) raised RuntimeError" in err
    assert "restarting it (1 of 3 restarts in 600 s)" in err
    wait_no_children()


class ResetRaisesEnv(gym.Env):
    """Ends every episode at its first step; its reset number ``raise_at`` (1-based) raises."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, raise_at: int = 0) -> None:
        self.calls, self.raise_at = 0, raise_at

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.calls += 1
        if self.calls == self.raise_at:
            raise RuntimeError("scenario failed to load")
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, True, False, {}


def test_an_error_in_a_later_grouped_reset_names_the_seed_that_reset_used():
    # Env 1 fails in global reset 1 (the second), in groups of 2: it was reset with its group's seed
    # (group 0), not its own index's, and with this reset's count, not the previous one's.
    envs = [ResetRaisesEnv(), ResetRaisesEnv(raise_at=2)]
    collector = Collector(envs, mode="dpsa", max_horizon=4, seed=50, group_size=2)
    with pytest.raises(EnvError) as e:
        for _ in range(4):
            collector.collect(MLPActorCritic(3, 2))
    seed = reset_seed(50, 1, 0)
    assert f"(index 1 of this sampler, seed {seed}) raised RuntimeError in reset" in str(e.value)
    assert seed not in (reset_seed(50, 0, 1), reset_seed(50, 1, 1))  # what the message used to name
