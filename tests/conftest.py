import os

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
