"""``MultiInputActorCritic``: the default policy for image, Dict / Tuple and Discrete observations and
for MultiDiscrete / MultiBinary actions (Stable-Baselines3's ``CnnPolicy`` and ``MultiInputPolicy``).

Each observation part is encoded on its own: an image by a Nature-CNN, a Box flattened, a Discrete
one-hot; the features are concatenated and shared by the actor and the critic, each an MLP of
``hidden_sizes`` (none over a lone image, as cleanrl's and SB3's Atari networks), then the action head.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fastlight.models.action_heads import ActionHead
from fastlight.models.base import ActionMapping, ActOutput, EvalOutput, Obs, PolicyBase
from fastlight.models.cnn import NatureCNN
from fastlight.models.mlp import mlp
from fastlight.models.spaces import Spaces, parse


class MultiInputActorCritic(PolicyBase):
    """Actor-critic over the env's spaces as :func:`~fastlight.models.spaces.describe_spaces` gives them.

    Args:
        spaces: ``{"obs": {part: descriptor}, "action": descriptor}`` (linked from the env by the CLI).
        hidden_sizes: hidden widths of the actor's and the critic's MLPs over the features.
        init_log_std: the Gaussian's initial log-std (Box actions).
        action_bound: Box actions are clipped to ``[-bound, bound]`` before ``env.step``.
    """

    def __init__(
        self,
        spaces: Spaces,
        *,
        hidden_sizes: tuple[int, ...] = (64, 64),
        init_log_std: float = 0.0,
        action_bound: float | None = 1.0,
    ) -> None:
        super().__init__()
        self.spaces = {"obs": dict(spaces["obs"]), "action": str(spaces["action"])}
        self.parts = [(key, *parse(d)) for key, d in self.spaces["obs"].items()]
        # ModuleDict keys cannot be "" or hold dots: the CNNs are keyed by the part's position.
        self.cnns = nn.ModuleDict({str(i): NatureCNN(shape) for i, (_, kind, shape) in enumerate(self.parts)
                                   if kind == "image"})  # fmt: skip
        width = sum(self._width(kind, shape) for _, kind, shape in self.parts)
        kind, sizes = parse(self.spaces["action"])
        self.head = ActionHead(kind, sizes, init_log_std=init_log_std, action_bound=action_bound)
        lone_image = len(self.parts) == 1 and self.parts[0][1] == "image"
        sizes = [width, *(() if lone_image else hidden_sizes)]
        self.actor = mlp([*sizes, self.head.out_dim], out_gain=0.01)
        self.critic = mlp([*sizes, 1], out_gain=1.0)

    @staticmethod
    def _width(kind: str, shape: tuple[int, ...]) -> int:
        return {"image": 512, "box": math.prod(shape), "discrete": shape[0]}.get(kind, sum(shape))

    def features(self, obs: Obs) -> Tensor:
        """Observation (a tensor ``[N, ...]``, or a dict of them by part) -> features ``[N, F]``."""
        out = []
        for i, (key, kind, shape) in enumerate(self.parts):
            x = obs[key] if isinstance(obs, dict) else obs
            n = x.shape[0]
            if kind == "image":
                out.append(self.cnns[str(i)](x))
            elif kind == "box":
                out.append(x.reshape(n, -1).float())
            else:  # discrete / multidiscrete: one one-hot per entry
                cols = x.long().reshape(n, -1)
                out += [F.one_hot(cols[:, j], k).float() for j, k in enumerate(shape)]
        return torch.cat(out, dim=-1)

    def act(self, obs: Obs, *, step: Tensor | None = None, deterministic: bool = False) -> ActOutput:
        x = self.features(obs)
        actions, logprobs = self.head.sample(self.actor(x), deterministic=deterministic)
        return ActOutput(actions, logprobs, self.critic(x).squeeze(-1))

    def evaluate(self, obs: Obs, actions: Tensor, *, step: Tensor | None = None) -> EvalOutput:
        x = self.features(obs)
        out, values = self.actor(x), self.critic(x).squeeze(-1)
        return EvalOutput(self.head.log_prob(out, actions), self.head.entropy(out), values)

    def value(self, obs: Obs, *, step: Tensor | None = None) -> Tensor:
        return self.critic(self.features(obs)).squeeze(-1)

    def action_mapping(self) -> ActionMapping:
        return self.head.action_mapping()
