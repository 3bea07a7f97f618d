"""PPO clipped surrogate with the SMPO reduction (FAST §SMPO; AcceRL §token-level ratios).

    r = exp(log π_θ - log π_old)             (per token, per action or per chunk)
    ℓ = -min(r·A, clip(r, 1-ε, 1+ε)·A)
    L = Σ valid·ℓ / max(Σ valid, 1)

Clipping zeroes the gradient only where it removes an incentive: ``r > 1+ε`` with ``A > 0`` and
``r < 1-ε`` with ``A < 0``. The other two cases keep the unclipped (pessimistic) term.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastlight.losses.masked import masked_mean
from fastlight.losses.ratios import policy_terms, ratio_diagnostics

__all__ = ["ppo_clip_loss"]


def ppo_clip_loss(
    *,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    valid: Tensor,
    clip_eps: float = 0.2,
    granularity: str = "token",
    tokens_per_action: int = 1,
    count: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped policy loss ``-min(r·A, clip(r, 1±ε)·A)``, SMPO-masked mean.

    Shapes: ``logprobs``, ``old_logprobs`` ``[N]`` or ``[N, K]``; ``advantages [N]`` (broadcast over
    the token axis; a per-token ``[N, K]`` is accepted too); ``valid [N]`` bool (or ``[N, K]`` with
    ``granularity="token"``). ``granularity``: ``token | action | chunk`` (see
    :func:`~fastlight.losses.ratios.log_ratio`). ``count``: denominator override for DDP, see
    :func:`~fastlight.losses.masked.masked_mean`.

    Returns the scalar loss and detached diagnostics ``approx_kl``, ``clip_frac``, ``ratio_mean``.
    """
    if clip_eps <= 0:
        raise ValueError(f"clip_eps must be > 0, got {clip_eps}")
    log_r, adv = policy_terms(logprobs, old_logprobs, advantages, valid, granularity, tokens_per_action)
    ratio = log_r.exp()
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv)
    loss = masked_mean(-surrogate, valid, count=count)
    return loss, ratio_diagnostics(log_r=log_r.detach(), valid=valid, clip_eps=clip_eps, count=count)
