"""A fastlight module for a new task: highway-env's ``merge-v0`` with a wider, layer-normed policy.

Run it with the CLI (the env's sizes are linked in automatically):

    fastlight fit --config examples/merge.yaml

What a subclass usually overrides is one hook; here it is ``build_policy``. The rest - DPSA
sampling, masked GAE, the SMPO loss, logging - is inherited. ``build_policy`` runs in Lightning's
``configure_model``, after ``__init__``: call ``super().__init__(**kwargs)`` first, set your own
attributes after it, and read them in ``build_policy``.

A policy class alone needs no subclass at all: inject it with ``--model.policy``, e.g.

    fastlight fit --config configs/highway_dpsa.yaml \
        --model.policy.class_path examples.merge_module.LayerNormMLP \
        --model.policy.init_args.obs_dim 25 --model.policy.init_args.action_dim 5
"""

from __future__ import annotations

import torch
from torch import nn

from fastlight.models.mlp import MLPActorCritic
from fastlight.modules.rl_module import RLModule


class LayerNormMLP(MLPActorCritic):
    """``MLPActorCritic`` whose observations are layer-normalised first (highway-env's
    Kinematics features have very different scales once ``normalize`` is off)."""

    def __init__(self, obs_dim: int, action_dim: int, **kwargs) -> None:
        super().__init__(obs_dim, action_dim, **kwargs)
        self.norm = nn.LayerNorm(obs_dim)

    def _flat(self, obs: torch.Tensor) -> torch.Tensor:
        return self.norm(super()._flat(obs))


class MergeModule(RLModule):
    """RLModule for ``merge-v0``.

    Args:
        width: hidden width of both MLPs.
        depth: number of hidden layers.
        **kwargs: every :class:`RLModule` setting (``lr``, ``gamma``, ``objective`` ...).
    """

    def __init__(self, width: int = 128, depth: int = 2, **kwargs) -> None:
        # RLModule's save_hyperparameters() records width and depth too (it walks the __init__
        # chain), so load_from_checkpoint rebuilds the same architecture.
        super().__init__(**kwargs)
        self.width, self.depth = width, depth

    def build_policy(self) -> nn.Module:
        """Called by ``configure_model`` (after ``__init__``), unless ``--model.policy`` is given."""
        h = self.hparams
        return LayerNormMLP(
            h.obs_dim, h.action_dim, continuous=h.continuous, hidden_sizes=(self.width,) * self.depth
        )
