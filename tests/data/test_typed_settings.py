"""RolloutDataModule's settings objects: each one changes what runs, a bad value is one line naming
its flag, and the old flat names are refused by the CLI like any unknown key."""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastlight.cli import cli_main
from fastlight.data.datamodule import RolloutDataModule
from fastlight.envs import EnvWrapper, ScenarioLoadCost
from fastlight.fleet import FaultSettings
from fastlight.fleet.base import FleetBuild
from fastlight.fleet.pool import SamplerPool
from fastlight.inference import InferenceSettings
from fastlight.models.mlp import MLPActorCritic
from tests.data.test_settings import sample

FIXED = "tests.fake_envs:FixedLength-v0"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "highway_dpsa.yaml")
SMALL = {"env_id": FIXED, "env_kwargs": {"lengths": (6,)}, "num_envs": 2, "num_workers": 1}


class EndAfter(EnvWrapper):
    """A test wrapper: every episode ends (truncated) after ``steps`` steps."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def wrap(self, env: gym.Env) -> gym.Env:
        return gym.wrappers.TimeLimit(env, max_episode_steps=self.steps)


class TwoObs(EnvWrapper):
    """A test wrapper that changes the observation size (3 -> 6)."""

    def wrap(self, env: gym.Env) -> gym.Env:
        space = gym.spaces.Box(-float("inf"), float("inf"), shape=(6,))
        return gym.wrappers.TransformObservation(env, lambda o: np.concatenate([o, o]), space)


def pool_of(dm: RolloutDataModule) -> SamplerPool:
    """The pool ``dm.start`` would build (its processes not started)."""
    policy = MLPActorCritic(dm.obs_dim, dm.action_dim)
    return SamplerPool(
        FleetBuild(
            dm.sampler_configs(0),
            policy,
            inference=dm.inference,
            example_obs=dm.example_obs,
            faults=dm.faults,
        )
    )


def test_inference_settings_reach_the_worker_and_null_means_a_policy_copy_per_sampler():
    plain = pool_of(RolloutDataModule(**SMALL))
    assert plain.client is None and plain.shared is not None
    served = pool_of(RolloutDataModule(**SMALL, inference=InferenceSettings(max_batch=7, max_wait_ms=3.0)))
    assert served.client is not None and served.shared is None
    assert (served.client.settings.max_batch, served.client.settings.max_wait_ms) == (7, 3.0)
    assert served.client.transport == "shared_memory"  # a CPU worker: the double buffer
    assert InferenceSettings().worker_device("cpu") == torch.device("cpu")  # null: the trainer's device
    assert InferenceSettings(device="cpu").worker_device("cuda:0") == torch.device("cpu")


def test_fault_settings_reach_the_pool():
    faults = FaultSettings(worker_timeout_s=5.0, max_worker_restarts=0, restart_window_s=9.0, heartbeat_s=2.0)
    pool = pool_of(RolloutDataModule(**SMALL, faults=faults))
    assert pool.faults == faults
    assert (pool.heartbeat_limits.heartbeat_s, pool.heartbeat_limits.start_timeout_s) == (2.0, 5.0)
    default = pool_of(RolloutDataModule(**SMALL)).faults
    assert (default.worker_timeout_s, default.max_worker_restarts, default.heartbeat_s) == (300.0, 3, 60.0)


def test_env_wrappers_wrap_every_sampler_env_and_the_probe():
    r = sample(RolloutDataModule(**SMALL, env_wrappers=[EndAfter(4)]))
    assert r.shape == (4, 2) and r.truncated[-1].all()  # the 6-step episodes end at 4
    assert sample(RolloutDataModule(**SMALL)).shape == (6, 2)
    assert RolloutDataModule(**SMALL, env_wrappers=[TwoObs()]).obs_dim == 6  # the policy sizes follow


@pytest.mark.parametrize(
    ("build", "line"),
    [
        (lambda: InferenceSettings(max_batch=0), "--data.inference.max_batch must be > 0, got 0"),
        (lambda: InferenceSettings(max_wait_ms=-1), "--data.inference.max_wait_ms must be > 0, got -1"),
        (lambda: InferenceSettings(device="tpu"), "--data.inference.device must be null, 'cpu' or 'cuda"),
        (lambda: FaultSettings(heartbeat_s=0), "--data.faults.heartbeat_s must be > 0, got 0"),
        (lambda: FaultSettings(max_worker_restarts=-1), "--data.faults.max_worker_restarts must be >= 0"),
        (lambda: ScenarioLoadCost(seconds=-1), "ScenarioLoadCost seconds must be >= 0, got -1"),
    ],
)
def test_bad_setting_values_are_one_line(build, line):
    with pytest.raises(ValueError) as e:
        build()
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
def test_a_cuda_inference_device_without_cuda_is_refused():
    with pytest.raises(ValueError, match="--data.inference.device is 'cuda:0' but this machine has no CUDA"):
        InferenceSettings(device="cuda:0")


def test_a_wrong_object_for_a_setting_is_named():
    with pytest.raises(TypeError, match=r"--data.inference must be null or InferenceSettings\(...\)"):
        RolloutDataModule(**SMALL, inference=True)  # today's `inference_server: true`, unconverted
    with pytest.raises(
        TypeError, match=r"--data.env_wrappers\[0\] must be a fastlight.envs.EnvWrapper or a gym"
    ):
        RolloutDataModule(**SMALL, env_wrappers=["gymnasium.wrappers.TimeLimit"])  # a name, not the class


def test_hparams_hold_the_settings_as_plain_data():
    dm = RolloutDataModule(
        **SMALL, inference=InferenceSettings(max_batch=8), env_wrappers=[ScenarioLoadCost(seconds=0.5)]
    )
    assert dm.hparams.inference == {**InferenceSettings().__dict__, "max_batch": 8}
    assert dm.hparams.faults["heartbeat_s"] == 60.0
    assert dm.hparams.env_wrappers == [
        {"class_path": "fastlight.envs.scenario_cost.ScenarioLoadCost", "init_args": {"seconds": 0.5}}
    ]
    assert dm.inference == InferenceSettings(max_batch=8)  # the objects stay the module's attributes


DATA, MODEL = 'Parser key "data": ', 'Parser key "model": '


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--data.heartbeat_s", "5"), f"{DATA}Option 'heartbeat_s' is not accepted"),
        (("--data.max_batch", "64"), f"{DATA}Option 'max_batch' is not accepted"),
        (("--data.inference_server", "true"), f"{DATA}Option 'inference_server' is not accepted"),
        (
            ("--data.nonfinite", "nan"),
            f"""{DATA}Parser key "nonfinite": Expected a typing.Literal['raise', 'drop']. Got value: nan""",
        ),
        (("--data.start_method", "fork"), f'{DATA}Parser key "start_method": '),
        (
            ("--model.ratio_granularity", "bits"),
            f"""{MODEL}Parser key "ratio_granularity": Expected a typing.Literal['token', 'action'""",
        ),
    ],
)
def test_cli_refuses_old_names_and_bad_literals_in_one_line(args, line):
    with pytest.raises(ValueError) as e:
        cli_main(["--config", CONFIG, *args], run=False)
    assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)


def test_cli_builds_the_settings_objects():
    cli = cli_main(
        ["--config", CONFIG, "--data.env_id", FIXED, "--data.num_envs", "2", "--data.num_workers", "1",
         "--data.inference.max_batch", "64", "--data.faults.heartbeat_s", "5", "--data.env_wrappers",
         "[{class_path: fastlight.envs.ScenarioLoadCost, init_args: {seconds: 0.01}}]"],
        run=False,
    )  # fmt: skip
    dm = cli.datamodule
    assert dm.inference == InferenceSettings(max_batch=64)
    assert dm.faults == FaultSettings(heartbeat_s=5.0)
    assert dm.env_wrappers == (ScenarioLoadCost(seconds=0.01),)
