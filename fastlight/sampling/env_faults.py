"""What an env can do wrong inside a sampler, named: a NaN / inf observation or reward, an exception in
``step`` or ``reset``. Checked where values enter (every step, every reset), so a failure names the env,
its index, seed and episode step instead of surfacing later as a torch error in an update."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch


class NonFiniteError(ValueError):
    """An env returned a NaN or infinite observation or reward (named: env, index, seed, step)."""


class EnvError(RuntimeError):
    """An env raised in ``step`` or ``reset`` (named: env, index, seed, episode step); the env's own
    exception is its ``__cause__``."""


def is_finite(value: Any) -> bool:
    """True unless a float in ``value`` (a number, an array, a dict of arrays) is NaN or infinite.
    Integer arrays (images, token ids) cannot hold either and are not scanned."""
    # Fast paths first: this runs twice per env step (reward and observation).
    if type(value) is np.ndarray:
        return value.dtype.kind not in "fc" or bool(np.isfinite(value).all())
    if isinstance(value, float):  # np.float64 is a float too
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(is_finite(v) for v in value.values())
    if isinstance(value, np.floating):
        return bool(np.isfinite(value))
    arr = np.asarray(value) if not isinstance(value, torch.Tensor) else value.numpy()
    return arr.dtype.kind not in "fc" or bool(np.isfinite(arr).all())


def preview(value: Any) -> str:
    if isinstance(value, dict):
        bad = [k for k, v in value.items() if not is_finite(v)]
        return f"keys {bad} hold NaN/inf"
    text = np.array2string(np.asarray(value), threshold=8, precision=3)
    return text if len(text) < 120 else text[:117] + "..."
