"""``MyVLAPolicy``: the user's own VLA (``examples/hf_vla/my_vla.py``) as a fastlight token policy.

``VLAModule`` (RL with GIPO / PPO, a value-head learning rate, self-imitation) and ``VLASFTModule``
(SFT on demonstrations) train any ``nn.Module`` that implements ``fastlight.models.base.TokenPolicy``.
Around the user's model this adds a critic on its detached features, the binning of continuous
actions, and the policy methods:

    fastlight fit --config examples/hf_vla/reach.yaml
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import Tensor, nn
from torch.distributions import Categorical

from examples.hf_vla.my_vla import MyVLA
from fastlight.models.action_mapping import BinsToActions
from fastlight.models.action_tokenizer import ActionTokenizer
from fastlight.models.base import ActionMapping, ActOutput, EvalOutput, PolicyBase
from fastlight.vla.imitation_loss import TokenImitation


class MyVLAPolicy(TokenImitation, PolicyBase):  # TokenImitation: SFT's and self-imitation's loss
    def __init__(self, state_dim: int = 39, action_dim: int = 4, n_bins: int = 64, hidden: int = 64,
                 layers: int = 2) -> None:  # fmt: skip
        super().__init__()
        self.state_dim, self.action_dim = state_dim, action_dim
        self.vla = MyVLA(state_dim, action_dim, n_bins=n_bins, hidden=hidden, layers=layers)
        self.critic = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        # Continuous actions in [-1, 1] <-> bins 0..n_bins-1 (SFT encodes demonstrations with it).
        self.action_tokenizer = ActionTokenizer(vocab_size=n_bins, n_bins=n_bins)

    def forward(self, obs: dict[str, Tensor], actions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Logits ``[N, K, n_bins]`` for SFT / self-imitation (parallel decoding: ``actions`` unused)."""
        ids = obs["instruction_ids"]
        mask = obs.get("instruction_mask", torch.ones_like(ids))
        return self.vla(obs["proprio"], ids, mask)

    def _heads(self, obs: dict[str, Tensor]) -> tuple[Categorical, Tensor]:
        logits, features = self(obs)
        return Categorical(logits=logits), self.critic(features.detach()).squeeze(-1)

    def act(
        self, obs: dict[str, Tensor], *, step: Tensor | None = None, deterministic: bool = False
    ) -> ActOutput:
        dist, values = self._heads(obs)
        bins = dist.probs.argmax(-1) if deterministic else dist.sample()
        return ActOutput(bins, dist.log_prob(bins), values)  # bins and log-probs [N, K]

    def evaluate(self, obs: dict[str, Tensor], actions: Tensor, *, step: Tensor | None = None) -> EvalOutput:
        dist, values = self._heads(obs)
        return EvalOutput(dist.log_prob(actions), dist.entropy(), values)

    def value(self, obs: dict[str, Tensor], *, step: Tensor | None = None) -> Tensor:
        return self._heads(obs)[1]

    def action_mapping(self) -> ActionMapping:
        return BinsToActions(self.action_tokenizer)  # bins -> bin centres in [-1, 1]

    def policy_parameters(self) -> list[nn.Parameter]:
        return list(self.vla.parameters())

    def value_parameters(self) -> list[nn.Parameter]:
        return list(self.critic.parameters())

    def check_obs_space(self, space: gym.spaces.Dict) -> None:
        """Optional: refuse an env whose state does not fit, before any sampler starts."""
        got = space["proprio"].shape[0] if "proprio" in space.spaces else 0
        if got != self.state_dim:
            raise ValueError(f"--model.policy.init_args.state_dim={self.state_dim}, the env's state is {got}")
