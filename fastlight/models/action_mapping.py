"""Action mappings: a policy's raw actions -> what ``env.step`` receives.

A mapping is a small, picklable callable that holds no weights, so a sampler can apply it to
actions served by the inference worker without a copy of the policy (AcceRL §architecture: the
policy lives in one process, samplers only step envs). Every policy returns its own from
``action_mapping()`` (:class:`~fastlight.models.base.Policy`); ``env_action`` applies it.

Shapes: ``actions [N, ...]`` -> ``[N, ...]``; a mapping never changes the batch dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from fastlight.models.action_tokenizer import ActionTokenizer

__all__ = ["BinsToActions", "ClampActions", "IdentityActions"]


@dataclass(frozen=True)
class IdentityActions:
    """Actions go to the env unchanged (discrete actions, or an env that clips for itself)."""

    def __call__(self, actions: Tensor) -> Tensor:
        return actions


@dataclass(frozen=True)
class ClampActions:
    """Continuous actions clipped to ``[-bound, bound]`` (a Gaussian policy's samples are unbounded)."""

    bound: float

    def __post_init__(self) -> None:
        if not self.bound > 0:
            raise ValueError(f"ClampActions bound must be > 0, got {self.bound}")

    def __call__(self, actions: Tensor) -> Tensor:
        return actions.clamp(-self.bound, self.bound)


@dataclass(frozen=True)
class BinsToActions:
    """VLA action-token bins ``[N, K]`` (long, in ``[0, n_bins)``) -> float actions ``[N, K]`` at the
    bin centres in ``[low, high]`` (:meth:`ActionTokenizer.decode`)."""

    tokenizer: ActionTokenizer

    def __call__(self, actions: Tensor) -> Tensor:
        return self.tokenizer.decode(actions)
