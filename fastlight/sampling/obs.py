"""Moving observations and actions between gymnasium (numpy) and policies (torch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fastlight.models.base import Policy


def stack_obs(obs: Sequence[Any]) -> np.ndarray | dict[str, np.ndarray]:
    """Stack per-env observations (arrays, or dicts of arrays) along a new leading axis."""
    if isinstance(obs[0], dict):
        return {k: np.stack([np.asarray(o[k]) for o in obs]) for k in obs[0]}
    return np.stack([np.asarray(o) for o in obs])


def obs_to_tensor(obs: np.ndarray | dict[str, np.ndarray]) -> Tensor | dict[str, Tensor]:
    """numpy -> torch without copying where possible; float64 becomes float32."""
    if isinstance(obs, dict):
        return {k: _to_tensor(v) for k, v in obs.items()}
    return _to_tensor(obs)


def _to_tensor(x: np.ndarray) -> Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.float() if t.dtype == torch.float64 else t


def action_to_env(policy: Policy, actions: Tensor) -> list[Any]:
    """Per-env actions for ``env.step``, through the policy's own mapping (e.g. VLA token bins to
    ``[-1, 1]``, a Gaussian policy's clip): :meth:`Policy.env_action`."""
    arr = policy.env_action(actions).detach().cpu().numpy()
    if arr.ndim == 1:
        return [a.item() for a in arr]
    return list(arr)
