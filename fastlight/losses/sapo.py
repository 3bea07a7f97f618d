"""SAPO: soft-gated policy objective, a baseline in AcceRL's objective comparison.

    r = exp(log π_θ - log π_old)
    τ = τ_pos where A > 0, else τ_neg
    ℓ = -(4/τ)·sigmoid(τ(r - 1))·A
    L = Σ valid·ℓ / max(Σ valid, 1)   (FAST §SMPO)

With ``p = sigmoid(τ(r - 1))`` the gradient is ``∇ℓ = -4·p(1-p)·r·A·∇log π_θ``: the plain policy
gradient ``-r·A·∇log π_θ`` times a smooth gate ``4p(1-p)`` that equals 1 on-policy (r = 1) and
decays for ratios far from 1. A slightly larger ``τ_neg`` gates negative advantages faster.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastlight.losses.masked import masked_mean
from fastlight.losses.ratios import policy_terms, ratio_diagnostics

__all__ = ["sapo_loss"]


def sapo_loss(
    *,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    valid: Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    granularity: str = "token",
    tokens_per_action: int = 1,
    clip_eps: float = 0.2,
    count: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO loss ``-(4/τ)·sigmoid(τ(r-1))·A``, ``τ = τ_pos`` if ``A > 0`` else ``τ_neg``; SMPO mean.

    Shapes and ``granularity``/``count`` as :func:`~fastlight.losses.ppo.ppo_clip_loss`.
    ``tau_pos``, ``tau_neg`` must be > 0. ``clip_eps`` only sets the ``clip_frac`` diagnostic.

    Returns the scalar loss and detached ``approx_kl``, ``clip_frac``, ``ratio_mean``.
    """
    for name, tau in (("tau_pos", tau_pos), ("tau_neg", tau_neg)):
        if not tau > 0:
            raise ValueError(f"{name} must be > 0, got {tau}")
    log_r, adv = policy_terms(logprobs, old_logprobs, advantages, valid, granularity, tokens_per_action)
    # τ in the inputs' dtype: torch.where on Python floats gives float32 (1.05 -> 1.0499999523).
    pos = torch.tensor(tau_pos, dtype=log_r.dtype, device=log_r.device)
    neg = torch.tensor(tau_neg, dtype=log_r.dtype, device=log_r.device)
    tau = torch.where(adv > 0, pos, neg)
    gate = torch.sigmoid(tau * (log_r.exp() - 1.0))
    loss = masked_mean(-(4.0 / tau) * gate * adv, valid, count=count)
    return loss, ratio_diagnostics(log_r=log_r.detach(), valid=valid, clip_eps=clip_eps, count=count)
