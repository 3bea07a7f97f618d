"""Moving observations and actions between gymnasium (numpy) and policies (torch)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fastlight.models.base import Policy


class ObservationShapeError(ValueError):
    """Observations that cannot be stacked: ``index`` (in the list given) has the layout ``shape``,
    the others mostly ``others`` (shapes as text; a dict observation shows each key's shape)."""

    def __init__(self, message: str, index: int, shape: str, others: str) -> None:
        super().__init__(message)
        self.index, self.shape, self.others = index, shape, others


def stack_obs(obs: Sequence[Any]) -> np.ndarray | dict[str, np.ndarray]:
    """Stack per-env observations (arrays, or dicts or tuples of arrays) along a new leading axis; a
    tuple's parts are keyed ``"0"``, ``"1"``, ... (:mod:`fastlight.models.spaces` names them so).

    Observations that differ in shape raise :class:`ObservationShapeError` naming the odd one
    (looked for only once stacking has failed).
    """
    if isinstance(obs[0], tuple):  # a Tuple space's observation: keyed "0", "1", ... as its parts
        obs = [{str(i): part for i, part in enumerate(o)} for o in obs]
    try:
        if isinstance(obs[0], dict):
            return {k: np.stack([np.asarray(o[k]) for o in obs]) for k in obs[0]}
        return np.stack([np.asarray(o) for o in obs])
    except (ValueError, KeyError) as e:  # KeyError: a dict observation without a key the first has
        odd = odd_observation(obs)
        if odd is None:
            raise
        i, shape, others = odd
        message = f"observation {i} of {len(obs)} has shape {shape}; the others have shape {others}"
        raise ObservationShapeError(message, i, shape, others) from e


def odd_observation(obs: Sequence[Any], spaces: Sequence[Any] | None = None) -> tuple[int, str, str] | None:
    """``(index, its shape, the others' shape)`` of the observation that does not stack with the
    others, ``None`` when all have one layout. With ``spaces`` (each env's observation space) the
    odd one is the first that does not match its own space; without, the first that differs from
    the most common layout."""
    layouts = [_layout(o) for o in obs]
    if len(set(layouts)) < 2:
        return None
    odd = None
    if spaces is not None:
        own = [_space_layout(space) for space in spaces]
        bad = [i for i, (lay, want) in enumerate(zip(layouts, own, strict=True)) if lay != want]
        if 0 < len(bad) < len(obs):  # all of them off their spaces: the spaces say nothing
            odd = bad[0]
    if odd is None:
        common = Counter(layouts).most_common(1)[0][0]
        odd = next(i for i, lay in enumerate(layouts) if lay != common)
    others = Counter(lay for lay in layouts if lay != layouts[odd]).most_common(1)[0][0]
    return odd, _show(layouts[odd]), _show(others)


def _layout(o: Any) -> Any:
    """Something hashable that equals for observations that stack: the shape, or each key's shape."""
    if isinstance(o, dict):
        return tuple(sorted((str(k), _layout(v)) for k, v in o.items()))
    try:
        return tuple(np.shape(o))
    except ValueError:  # a ragged nested list has no shape
        return f"a ragged {type(o).__name__}"


def _space_layout(space: Any) -> Any:
    spaces = getattr(space, "spaces", None)
    if isinstance(spaces, dict):  # gymnasium.spaces.Dict
        return tuple(sorted((str(k), _space_layout(v)) for k, v in spaces.items()))
    shape = getattr(space, "shape", None)
    return tuple(shape) if shape is not None else None


def _show(layout: Any) -> str:
    keyed = isinstance(layout, tuple) and layout and isinstance(layout[0], tuple)
    if keyed and isinstance(layout[0][0], str):  # a dict observation's (key, layout) pairs
        return "{" + ", ".join(f"{k!r}: {_show(v)}" for k, v in layout) + "}"
    return str(layout)


def obs_to_tensor(obs: np.ndarray | dict[str, np.ndarray]) -> Tensor | dict[str, Tensor]:
    """numpy -> torch without copying where possible; float64 becomes float32."""
    return {k: _to_tensor(v) for k, v in obs.items()} if isinstance(obs, dict) else _to_tensor(obs)


def _to_tensor(x: np.ndarray) -> Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.float() if t.dtype == torch.float64 else t


def action_to_env(policy: Policy, actions: Tensor) -> list[Any]:
    """Per-env actions for ``env.step``, through the policy's own mapping (e.g. VLA token bins to
    ``[-1, 1]``, a Gaussian policy's clip): :meth:`Policy.env_action`."""
    arr = policy.env_action(actions).detach().cpu().numpy()
    return [a.item() for a in arr] if arr.ndim == 1 else list(arr)
