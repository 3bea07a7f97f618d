"""Policies that act greedily (``deterministic=True``) whatever the caller asks.

A sampler samples with its own RNG, an inference worker with another, so sampled actions of the
two paths cannot be compared; the greedy action of the same weights on the same observation can.
Module-level classes, so spawned samplers and the inference worker can unpickle them.
"""

from __future__ import annotations

from fastlight.models.mlp import MLPActorCritic
from fastlight.models.vla import VLAPolicy


class GreedyMLP(MLPActorCritic):
    def act(self, obs, *, step=None, deterministic=False):
        return super().act(obs, step=step, deterministic=True)


class GreedyVLA(VLAPolicy):
    def act(self, obs, *, step=None, deterministic=False):
        return super().act(obs, step=step, deterministic=True)
