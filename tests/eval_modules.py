"""A module subclass for the evaluation tests: a checkpoint of it only loads as this class.

Its policy has one hidden layer of ``width`` units (RLModule's default has two of 64), so loading
its checkpoint as a plain ``RLModule`` would fail on the state dict's shapes.
"""

from __future__ import annotations

from torch import nn

from fastlight.models.mlp import MLPActorCritic
from fastlight.modules.rl_module import RLModule


class NarrowModule(RLModule):
    """RLModule with a one-layer policy of ``width`` hidden units."""

    def __init__(self, width: int = 8, **kwargs) -> None:
        super().__init__(**kwargs)
        self.width = width

    def build_policy(self) -> nn.Module:
        h = self.hparams
        return MLPActorCritic(h.obs_dim, h.action_dim, continuous=h.continuous, hidden_sizes=(self.width,))
