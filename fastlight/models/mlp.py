"""``MLPActorCritic``: separate actor and critic MLPs over flat vector observations.

Observations of any shape (e.g. highway-env's Kinematics ``[V, F]`` table) are flattened to
``obs_dim``. Discrete action spaces use a Categorical head, continuous ones a diagonal
Gaussian with a state-independent log-std (as in PPO's MuJoCo setting).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.distributions import Categorical, Normal

from fastlight.models.action_mapping import ClampActions, IdentityActions
from fastlight.models.base import ActionMapping, ActOutput, EvalOutput, PolicyBase


def mlp(sizes: list[int], *, out_gain: float) -> nn.Sequential:
    """Linear layers ``sizes[0] -> ... -> sizes[-1]`` with Tanh between them (none after the last)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        # Orthogonal init with a small policy-output gain: the standard PPO recipe.
        nn.init.orthogonal_(lin.weight, gain=out_gain if last else math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


class MLPActorCritic(PolicyBase):
    """Actor-critic for vector observations.

    Args:
        obs_dim: flattened observation size (linked from the env by the CLI).
        action_dim: number of discrete actions, or the continuous action dimension.
        continuous: Gaussian policy if True, Categorical otherwise.
        hidden_sizes: hidden layer widths of both MLPs.
        action_bound: continuous actions are clipped to ``[-bound, bound]`` before ``env.step``.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        *,
        continuous: bool = False,
        hidden_sizes: tuple[int, ...] = (64, 64),
        init_log_std: float = 0.0,
        action_bound: float | None = 1.0,
    ) -> None:
        super().__init__()
        if obs_dim < 1 or action_dim < 1:
            raise ValueError(
                f"MLPActorCritic needs obs_dim >= 1 and action_dim >= 1, got {obs_dim}, {action_dim}"
            )
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.continuous, self.action_bound = continuous, action_bound
        sizes = [obs_dim, *hidden_sizes]
        self.actor = mlp([*sizes, action_dim], out_gain=0.01)
        self.critic = mlp([*sizes, 1], out_gain=1.0)
        if continuous:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    def _flat(self, obs: Tensor) -> Tensor:
        x = obs.reshape(obs.shape[0], -1).float()
        if x.shape[1] != self.obs_dim:
            raise ValueError(
                f"MLPActorCritic: observation flattens to {x.shape[1]} features, expected {self.obs_dim}"
            )
        return x

    def _dist(self, x: Tensor) -> Categorical | Normal:
        out = self.actor(x)
        if self.continuous:
            return Normal(out, self.log_std.exp().expand_as(out))
        return Categorical(logits=out)

    def _logprob(self, dist: Categorical | Normal, actions: Tensor) -> Tensor:
        lp = dist.log_prob(actions)
        return lp.sum(-1) if self.continuous else lp.clone()  # Categorical's is a view: see _value

    def act(self, obs: Tensor, *, step: Tensor | None = None, deterministic: bool = False) -> ActOutput:
        x = self._flat(obs)
        dist = self._dist(x)
        actions = (
            (dist.mean if self.continuous else dist.probs.argmax(-1)) if deterministic else dist.sample()
        )
        return ActOutput(actions, self._logprob(dist, actions), self._value(x))

    def evaluate(self, obs: Tensor, actions: Tensor, *, step: Tensor | None = None) -> EvalOutput:
        x = self._flat(obs)
        dist = self._dist(x)
        ent = dist.entropy().sum(-1) if self.continuous else dist.entropy()
        return EvalOutput(self._logprob(dist, actions), ent, self._value(x))

    def value(self, obs: Tensor, *, step: Tensor | None = None) -> Tensor:
        return self._value(self._flat(obs))

    def _value(self, x: Tensor) -> Tensor:
        # A tensor of its own, not a view: FSDP2 warns about a view returned by a method it hooks.
        return self.critic(x).squeeze(-1).clone()

    def action_mapping(self) -> ActionMapping:
        """Continuous actions are clipped to ``[-action_bound, action_bound]``; discrete ones pass."""
        if self.continuous and self.action_bound is not None:
            return ClampActions(float(self.action_bound))
        return IdentityActions()
