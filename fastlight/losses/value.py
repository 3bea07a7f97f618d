"""Critic loss, entropy bonus and explained variance, all SMPO-masked (FAST §SMPO).

Formulas (sums over valid steps only):

    value loss      L_V = Σ valid·½(V - R)² / max(Σ valid, 1)
    clipped (PPO2)  V_c = V_old + clip(V - V_old, -ε, ε);  ℓ = ½·max((V - R)², (V_c - R)²)
    entropy         H   = Σ valid·H_t / max(Σ valid, 1)
    explained var   EV  = 1 - Var[R - V] / Var[R]   (over valid steps)
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastlight.losses.masked import check_mask, masked_mean, masked_var, zero_invalid

__all__ = ["entropy_bonus", "explained_variance", "value_loss"]


def _check_same(a: Tensor, b: Tensor, a_name: str, b_name: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{a_name} shape {tuple(a.shape)} != {b_name} shape {tuple(b.shape)}")


def value_loss(
    *,
    values: Tensor,
    returns: Tensor,
    valid: Tensor,
    old_values: Tensor | None = None,
    clip_eps: float | None = None,
    count: Tensor | float | None = None,
) -> Tensor:
    """``½(V - R)²`` SMPO-masked mean; PPO2-style clipped variant when ``clip_eps`` is set.

    Shapes: ``values``, ``returns`` (and ``old_values``) equal, e.g. ``[N]`` or ``[T, E]``;
    ``valid`` bool with that shape or a prefix of it. ``clip_eps`` (> 0) requires ``old_values``
    (the behaviour critic's V) and takes the element-wise max of the clipped and unclipped squared
    errors. ``count``: DDP denominator override, see :func:`~fastlight.losses.masked.masked_mean`.
    Returns a scalar.
    """
    _check_same(values, returns, "values", "returns")
    check_mask(values, valid, x_name="values", mask_name="valid")
    # Zero the inputs first: a NaN return in a padded slot would make the gradient 0·NaN.
    v = zero_invalid(values, valid)
    err = (v - zero_invalid(returns, valid)).square()
    if clip_eps is not None:
        if old_values is None:
            raise ValueError("value_loss: clip_eps is set, so old_values is required")
        if not clip_eps > 0:
            raise ValueError(f"value_loss: clip_eps must be > 0, got {clip_eps}")
        _check_same(values, old_values, "values", "old_values")
        old = zero_invalid(old_values, valid)
        v_clipped = old + (v - old).clamp(-clip_eps, clip_eps)
        err = torch.maximum(err, (v_clipped - zero_invalid(returns, valid)).square())
    return masked_mean(0.5 * err, valid, count=count)


def entropy_bonus(*, entropy: Tensor, valid: Tensor, count: Tensor | float | None = None) -> Tensor:
    """Mean policy entropy over valid steps (tokens), SMPO-masked; returns a scalar.

    The sign is the entropy itself (positive): the module *subtracts* ``coef · entropy_bonus``.
    Shapes: ``entropy [N]`` or ``[N, K]``; ``valid [N]`` (or equal to ``entropy``'s shape).
    """
    return masked_mean(entropy, valid, count=count)


@torch.no_grad()
def explained_variance(*, values: Tensor, returns: Tensor, valid: Tensor) -> Tensor:
    """``1 - Var[R - V] / Var[R]`` over valid steps, detached scalar (a diagnostic, no ``.item()``).

    1 is a perfect critic, 0 no better than a constant, negative worse. When ``Var[R]`` is 0 (all
    valid returns equal, or no valid step) the ratio is undefined; we return 0 ("explains
    nothing") rather than NaN/inf so that logged averages stay finite.
    Shapes: ``values``, ``returns`` equal; ``valid`` bool, equal or a prefix.
    """
    _check_same(values, returns, "values", "returns")
    check_mask(values, valid, x_name="values", mask_name="valid")
    ret = zero_invalid(returns, valid)
    var_r = masked_var(ret, valid)
    var_res = masked_var(ret - zero_invalid(values, valid), valid)
    safe = torch.where(var_r > 0, var_r, torch.ones_like(var_r))
    return torch.where(var_r > 0, 1.0 - var_res / safe, torch.zeros_like(var_r))
