"""Masked reductions: the SMPO reduction of FAST and the helpers every loss builds on.

FAST §SMPO (Scaled Mask-Padding Optimization): every loss term is a masked sum divided by the
number of *valid* transitions,

    L = Σ valid·ℓ / max(Σ valid, 1),

so DPSA dummy steps and padding have exactly zero effect on the value *and* the gradient.

Shape contract shared by every function here: ``mask`` is a ``bool`` tensor whose shape equals
``x.shape`` or a prefix of it (``mask [N]`` with ``x [N, K]`` masks whole rows and broadcasts
over ``K``). A wrong shape or dtype raises ``ValueError`` naming both shapes.

Padded slots are selected away with ``torch.where`` rather than multiplied by ``0``: ``0·NaN``
is ``NaN`` (in the value and in the backward pass), while ``where`` returns an exact ``0`` and
routes an exact ``0`` gradient to the unselected branch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["check_mask", "expand_mask", "masked_mean", "masked_sum", "masked_var", "zero_invalid"]


def check_mask(x: Tensor, mask: Tensor, *, x_name: str = "x", mask_name: str = "mask") -> None:
    """Raise ``ValueError`` unless ``mask`` is bool and its shape is a prefix of ``x.shape``."""
    if mask.dtype != torch.bool:
        raise ValueError(f"{mask_name} must be a bool tensor, got dtype {mask.dtype}")
    if mask.ndim > x.ndim or tuple(x.shape[: mask.ndim]) != tuple(mask.shape):
        raise ValueError(
            f"{mask_name} shape {tuple(mask.shape)} must equal {x_name} shape {tuple(x.shape)} "
            "or a prefix of it"
        )


def expand_mask(mask: Tensor, x: Tensor) -> Tensor:
    """View of ``mask`` broadcast to ``x.shape`` (trailing singleton axes added); no copy."""
    return mask.reshape(*mask.shape, *([1] * (x.ndim - mask.ndim))).expand_as(x)


def zero_invalid(x: Tensor, mask: Tensor) -> Tensor:
    """``where(mask, x, 0)``: exact zeros in padded slots, whatever garbage (NaN, inf) they hold;
    losses apply it to their *inputs* first (see the module docstring)."""
    check_mask(x, mask)
    return torch.where(expand_mask(mask, x), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    """``Σ valid·x`` over all elements, as a scalar tensor (padded slots contribute exactly 0).

    Shapes: ``x [*B, *R]``, ``mask [*B]`` bool; returns ``[]``.
    """
    return zero_invalid(x, mask).sum()


def masked_mean(x: Tensor, mask: Tensor, *, count: Tensor | float | None = None) -> Tensor:
    """SMPO masked mean ``Σ valid·x / max(Σ valid, 1)`` (FAST §SMPO), as a scalar tensor.

    Shapes: ``x [*B, *R]``, ``mask [*B]`` bool; returns ``[]``. With a row mask the denominator
    counts elements, ``Σ mask · prod(R)``, so a token-level loss is the mean over valid tokens.

    ``count`` replaces ``Σ mask`` (in mask entries; ``prod(R)`` still applies; 0 is treated as 1).
    Under DDP the module passes ``global_count / W``, so DDP's gradient averaging over ``W`` ranks
    yields exactly the global SMPO mean ``global_sum / global_count``.
    """
    total = masked_sum(x, mask)
    per_entry = math.prod(x.shape[mask.ndim :])  # elements of x per mask entry
    if count is None:
        return total / (mask.sum() * per_entry).clamp_min(1).to(total.dtype)
    count_t = torch.as_tensor(count, dtype=total.dtype, device=total.device)
    # Fractional counts are legitimate here (global_count / W), so only a zero is guarded.
    count_t = torch.where(count_t > 0, count_t, torch.ones_like(count_t))
    return total / (count_t * per_entry)


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Population variance of the valid elements, ``mean((x - mean)²)``; 0 when none is valid.

    Two-pass (centre first) rather than ``E[x²] - E[x]²`` to avoid cancellation in float32.
    Shapes as :func:`masked_mean`; returns ``[]``.
    """
    mean = masked_mean(x, mask)
    return masked_mean((x - mean).square(), mask)
