"""Action mappings: a policy's raw actions -> what ``env.step`` receives.

A mapping is a small, picklable callable that holds no weights, so a sampler can apply it to
actions served by the inference worker without a copy of the policy (AcceRL §architecture). Shapes:
``actions [N, ...]`` -> ``[N, ...]``; a mapping never changes the batch dimension.

A policy that emits ``H`` env actions per call (OpenVLA-OFT, pi0, SmolVLA) returns a
:class:`ChunkedActionMapping`; the sampler and the evaluation execute its chunk open-loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

from fastlight.models.action_tokenizer import ActionTokenizer
from fastlight.models.base import ActionMapping

__all__ = [
    "BinsToActions",
    "ChunkActions",
    "ChunkedActionMapping",
    "ClampActions",
    "IdentityActions",
    "action_chunk",
]


@runtime_checkable
class ChunkedActionMapping(ActionMapping, Protocol):
    """A mapping of a policy that acts in chunks: policy actions ``[N, ...]`` -> env actions
    ``[N, H, ...]`` with ``H = action_chunk`` (env step ``h`` of the chunk is ``[:, h]``)."""

    action_chunk: int


def action_chunk(mapping: ActionMapping) -> int | None:
    """``H`` of a :class:`ChunkedActionMapping`; ``None`` for a mapping of one env action per call
    (its env actions are ``[N, ...]``, no chunk axis)."""
    return int(mapping.action_chunk) if isinstance(mapping, ChunkedActionMapping) else None


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


@dataclass(frozen=True)
class ChunkActions:
    """A per-step, shape-keeping ``mapping`` applied to a chunk: actions ``[N, H * D]`` (step-major) ->
    env actions ``[N, H, D]`` (leading dims other than ``N``, e.g. a Rollout's ``[T, E]``, are kept)."""

    mapping: ActionMapping
    action_chunk: int

    def __post_init__(self) -> None:
        if not (isinstance(self.action_chunk, int) and self.action_chunk >= 1):
            raise ValueError(f"ChunkActions action_chunk must be an int >= 1, got {self.action_chunk!r}")

    def __call__(self, actions: Tensor) -> Tensor:
        out, h = self.mapping(actions), self.action_chunk
        if out.dim() < 2 or out.shape[-1] % h:
            raise ValueError(f"ChunkActions: actions must map to [N, H*D] with H={h}, got {tuple(out.shape)}")
        return out.reshape(*out.shape[:-1], h, out.shape[-1] // h)  # leading dims ([T, E]) kept
