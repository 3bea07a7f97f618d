"""GIPO: Gaussian trust-weighted policy objective (AcceRL §GIPO; the GIPO authors' code).

    r = exp(log π_θ - log π_old)
    w = exp(-½ (log r / σ)²)          computed detached (a weight, not a path for gradients)
    ℓ = -w·r·A
    L = Σ valid·ℓ / max(Σ valid, 1)   (FAST §SMPO)

Instead of PPO's hard clip (which zeroes the gradient of stale samples), the Gaussian weight in
log-ratio space smoothly damps extreme ratios: ``∇ℓ = -w·r·A·∇log π_θ``. AcceRL sweeps
σ ∈ {0.2, 0.5, 1.0}; a narrow σ stabilises very stale (asynchronous) data.
"""

from __future__ import annotations

from torch import Tensor

from fastlight.losses.masked import masked_mean
from fastlight.losses.ratios import policy_terms, ratio_diagnostics

__all__ = ["gipo_loss"]


def gipo_loss(
    *,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    valid: Tensor,
    sigma: float = 0.5,
    granularity: str = "token",
    tokens_per_action: int = 1,
    clip_eps: float = 0.2,
    count: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GIPO loss ``-w·r·A`` with ``w = exp(-½ (log r / σ)²)`` detached, SMPO-masked mean.

    Shapes and ``granularity``/``count`` as :func:`~fastlight.losses.ppo.ppo_clip_loss`.
    ``sigma`` (> 0) is the trust width in log-ratio space. ``clip_eps`` does not enter the loss:
    it only sets the ``clip_frac`` diagnostic (the fraction PPO would clip), so the logs of the
    three objectives are comparable.

    Returns the scalar loss and detached ``approx_kl``, ``clip_frac``, ``ratio_mean`` and
    ``trust_weight_mean`` (the masked mean of ``w``).
    """
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    log_r, adv = policy_terms(logprobs, old_logprobs, advantages, valid, granularity, tokens_per_action)
    weight = (-0.5 * (log_r.detach() / sigma).square()).exp()
    loss = masked_mean(-weight * log_r.exp() * adv, valid, count=count)
    info = ratio_diagnostics(log_r=log_r.detach(), valid=valid, clip_eps=clip_eps, count=count)
    info["trust_weight_mean"] = masked_mean(weight, valid, count=count)
    return loss, info
