"""PolicyBase: a user's policy implements four methods; env_action is the mapping applied."""

from __future__ import annotations

import pytest
import torch

from fastlight.models.action_mapping import ClampActions
from fastlight.models.base import ActOutput, EvalOutput, Policy, PolicyBase, check_policy
from fastlight.models.mlp import MLPActorCritic


class Clamped(PolicyBase):
    def act(self, obs, *, step=None, deterministic=False):
        n = obs.shape[0]
        return ActOutput(torch.full((n, 1), 3.0), torch.zeros(n), torch.zeros(n))

    def evaluate(self, obs, actions, *, step=None):
        n = obs.shape[0]
        return EvalOutput(torch.zeros(n), torch.zeros(n), torch.zeros(n))

    def value(self, obs, *, step=None):
        return torch.zeros(obs.shape[0])

    def action_mapping(self):
        return ClampActions(0.5)


def test_env_action_applies_the_policy_mapping() -> None:
    policy = Clamped()
    check_policy(policy)
    assert isinstance(policy, Policy) and isinstance(policy, torch.nn.Module)
    actions = policy.act(torch.zeros(2, 4)).actions
    assert torch.equal(policy.env_action(actions), torch.full((2, 1), 0.5))


def test_a_subclass_missing_a_method_cannot_be_built() -> None:
    class NoMapping(PolicyBase):
        act = Clamped.act
        evaluate = Clamped.evaluate
        value = Clamped.value

    with pytest.raises(TypeError, match="action_mapping"):
        NoMapping()


def test_fastlight_policies_derive_from_it() -> None:
    mlp = MLPActorCritic(obs_dim=3, action_dim=2, continuous=True, action_bound=1.0)
    assert isinstance(mlp, PolicyBase)
    assert torch.equal(mlp.env_action(torch.tensor([[2.0, -3.0]])), torch.tensor([[1.0, -1.0]]))
