import os
from pathlib import Path

import pytest
import torch

from fastlight.models.action_mapping import IdentityActions
from fastlight.models.base import ActOutput, EvalOutput

os.environ.setdefault("MUJOCO_GL", "egl")
torch.set_num_threads(1)


class ObsValuePolicy(torch.nn.Module):
    """Deterministic policy for bookkeeping tests: action 0, logprob 0, V(s) = 10*tag + step."""

    obs_dim = 3
    action_dim = 2
    continuous = False

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def _v(self, obs):
        return 10 * obs[:, 0] + obs[:, 1]

    def act(self, obs, *, step=None, deterministic=False):
        n = obs.shape[0]
        return ActOutput(torch.zeros(n, dtype=torch.long), torch.zeros(n), self._v(obs))

    def evaluate(self, obs, actions, *, step=None):
        n = obs.shape[0]
        return EvalOutput(torch.zeros(n) + self.w, torch.zeros(n), self._v(obs))

    def value(self, obs, *, step=None):
        return self._v(obs)

    def action_mapping(self):
        return IdentityActions()

    def env_action(self, actions):
        return actions


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
    config = Path(__file__).resolve().parents[1] / "configs" / "highway_dpsa.yaml"
    cli_main(
        ["fit", "--config", str(config), "--model", "tests.eval_modules.NarrowModule", "--model.width", "8",
         "--model.update_epochs", "1", "--model.num_minibatches", "1", "--trainer.max_steps", "2",
         "--data.num_envs", "1", "--data.num_workers", "1", "--data.max_horizon", "40",
         "--data.cycles_per_step", "1", "--data.steps_per_epoch", "1",
         "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root)]
    )  # fmt: skip
    assert (root / "checkpoints" / "last.ckpt").is_file(), sorted(root.rglob("*"))
    return root
