"""Shared by the library's tests (tests/) and the benchmarks' tests (benchmarks/tests/).

Sampler processes start from a forkserver warmed once per session, as the ``fastlight`` command
does for every ``fit`` (:mod:`fastlight.fleet.start`): a spawned sampler re-imports torch,
gymnasium and highway-env (3-4 s of CPU each on 2 cores), a forked one does not. Tests that pin
``start_method="spawn"`` (the start-up, import and orphan tests) keep spawn.
"""

import os
from pathlib import Path

import pytest
import torch

from tests.policies import ObsValuePolicy

os.environ.setdefault("MUJOCO_GL", "egl")
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def warm_forkserver() -> None:
    from fastlight.fleet.start import warm_forkserver

    warm_forkserver("highway-fast-v0")


@pytest.fixture
def obs_value_policy():
    return ObsValuePolicy()


@pytest.fixture(scope="session")
def highway_run(tmp_path_factory) -> Path:
    """A real 2-update run of the highway config with a module subclass (``tests.eval_modules``),
    for the evaluation and plotting tests: its checkpoint, CSV and TensorBoard logs under the root.

    Two rollouts (so that the throughput callback's cumulative env-step count is logged once) of
    one env each, to its end (a crash or highway-env's 30 steps), so that `rollout/return` is logged.
    """
    from fastlight.cli import cli_main

    root = tmp_path_factory.mktemp("highway_run")
    config = Path(__file__).resolve().parent / "configs" / "highway_dpsa.yaml"
    cli_main(
        ["fit", "--config", str(config), "--model", "tests.eval_modules.NarrowModule", "--model.width", "8",
         "--model.update_epochs", "1", "--model.num_minibatches", "1", "--trainer.max_steps", "2",
         "--data.num_envs", "1", "--data.num_workers", "1", "--data.max_horizon", "40",
         "--data.cycles_per_step", "1", "--data.steps_per_epoch", "1",
         "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root)]
    )  # fmt: skip
    assert (root / "checkpoints" / "last.ckpt").is_file(), sorted(root.rglob("*"))
    return root
