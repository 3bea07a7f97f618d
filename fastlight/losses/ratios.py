"""Importance ratios at token, action or chunk granularity (AcceRL §optimisation granularity).

A VLA policy emits ``K`` action tokens per policy call: ``K = H x D`` for an action chunk of ``H``
env actions of ``D`` dimensions, step-major (chunk step 0's ``D`` tokens first; ``H = 1`` without
chunks). AcceRL compares three ways of forming the PPO ratio ``r = π_θ / π_old``:

- ``token``  (AcceRL's choice): one ratio per token, ``log r_k = logp_k - old_k`` → ``[N, K]``;
  an outlier token is clipped alone and the other tokens keep their gradient.
- ``action``: one ratio per group of ``tokens_per_action`` consecutive tokens, from their *mean*
  token log-ratio (the geometric mean of their ratios) → ``[N, K // tokens_per_action]``. With
  ``tokens_per_action = D`` a group is one env action (one chunk step), which is what
  ``RLModule`` uses unless ``--model.tokens_per_action`` says otherwise.
- ``chunk``: one ratio for the whole policy call, the product of its token probabilities,
  ``log r = Σ_k (logp_k - old_k)`` → ``[N]``; one outlier token clips the whole chunk.

This module also holds what PPO, GIPO and SAPO share: the padding-safe preparation of
``(log r, A)`` and the ratio diagnostics they log.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from fastlight.losses.masked import check_mask, masked_mean, zero_invalid

__all__ = ["GRANULARITIES", "Granularity", "log_ratio", "policy_terms", "ratio_diagnostics"]

#: Where an importance ratio is taken: per action token, per action, or per chunk (their product).
Granularity = Literal["token", "action", "chunk"]
GRANULARITIES: tuple[str, ...] = get_args(Granularity)


def _check_pair(logprobs: Tensor, old_logprobs: Tensor) -> None:
    if logprobs.shape != old_logprobs.shape:
        raise ValueError(
            f"logprobs shape {tuple(logprobs.shape)} != old_logprobs shape {tuple(old_logprobs.shape)}"
        )


def log_ratio(
    *, logprobs: Tensor, old_logprobs: Tensor, granularity: str = "token", tokens_per_action: int = 1
) -> Tensor:
    """``log r`` at the requested granularity (AcceRL §token-level ratios).

    Shapes: ``logprobs``, ``old_logprobs`` ``[N]`` or ``[N, K]`` (equal). Returns ``[N]`` for
    ``[N]`` inputs (granularity is then irrelevant); for ``[N, K]`` inputs ``token`` → ``[N, K]``,
    ``action`` → ``[N, K // tokens_per_action]`` (``K`` must be divisible), ``chunk`` → ``[N]``.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of token | action | chunk, got {granularity!r}")
    if tokens_per_action < 1:
        raise ValueError(f"tokens_per_action must be >= 1, got {tokens_per_action}")
    _check_pair(logprobs, old_logprobs)
    if logprobs.ndim not in (1, 2):
        raise ValueError(f"logprobs must be [N] or [N, K], got shape {tuple(logprobs.shape)}")
    diff = logprobs - old_logprobs
    if diff.ndim == 1 or granularity == "token":
        return diff
    if granularity == "chunk":
        # log Π_k r_k = Σ_k log r_k: the joint probability ratio of the whole chunk.
        return diff.sum(dim=-1)
    n, k = diff.shape
    if k % tokens_per_action != 0:
        raise ValueError(
            f"granularity='action' needs K divisible by tokens_per_action, got K={k}, "
            f"tokens_per_action={tokens_per_action}"
        )
    # mean(logp) - mean(old) == mean(logp - old): the geometric mean of the token ratios.
    return diff.reshape(n, k // tokens_per_action, tokens_per_action).mean(dim=-1)


def policy_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    valid: Tensor,
    granularity: str,
    tokens_per_action: int,
) -> tuple[Tensor, Tensor]:
    """Padding-safe ``(log r, A)`` broadcast to the ratio shape, shared by PPO, GIPO and SAPO.

    Shapes: ``logprobs``/``old_logprobs`` ``[N]`` or ``[N, K]``; ``valid`` bool, a prefix of both
    the log-prob shape and the ratio shape (``[N]``, or ``[N, K]`` with ``token`` granularity);
    ``advantages`` a prefix of the ratio shape (``[N]`` usually, per-token ``[N, K]`` allowed).
    Returns two tensors of the ratio shape (see :func:`log_ratio`), exactly 0 where invalid: inputs
    are zeroed in padded slots *before* any arithmetic (:func:`~fastlight.losses.masked.zero_invalid`).
    """
    _check_pair(logprobs, old_logprobs)
    check_mask(logprobs, valid, x_name="logprobs", mask_name="valid")
    # Both log-probs are 0 in padded slots, so log r is exactly 0 there at every granularity.
    lp = zero_invalid(logprobs, valid)
    old = zero_invalid(old_logprobs, valid)
    log_r = log_ratio(
        logprobs=lp, old_logprobs=old, granularity=granularity, tokens_per_action=tokens_per_action
    )
    check_mask(log_r, valid, x_name=f"{granularity}-level ratio", mask_name="valid")
    if advantages.ndim > log_r.ndim or tuple(log_r.shape[: advantages.ndim]) != tuple(advantages.shape):
        raise ValueError(
            f"advantages shape {tuple(advantages.shape)} must equal the {granularity}-level ratio "
            f"shape {tuple(log_r.shape)} or a prefix of it"
        )
    adv = advantages.reshape(*advantages.shape, *([1] * (log_r.ndim - advantages.ndim)))
    return log_r, zero_invalid(adv.expand_as(log_r), valid)


@torch.no_grad()
def ratio_diagnostics(
    *, log_r: Tensor, valid: Tensor, clip_eps: float, count: Tensor | float | None = None
) -> dict[str, Tensor]:
    """Detached ratio statistics, SMPO-masked means (no ``.item()``: no host sync).

    - ``approx_kl``: ``(r - 1) - log r``, the non-negative unbiased KL(old‖new) estimator.
    - ``clip_frac``: fraction of valid ratios with ``|r - 1| > clip_eps``.
    - ``ratio_mean``: mean ``r``.

    ``count`` as in :func:`~fastlight.losses.masked.masked_mean`: with the DDP count the rank
    average of each statistic is its exact global mean. Shapes: ``log_r [*B, *R]``, ``valid [*B]``.
    """
    ratio = log_r.exp()
    clipped = ((ratio - 1.0).abs() > clip_eps).to(log_r.dtype)
    return {
        "approx_kl": masked_mean((ratio - 1.0) - log_r, valid, count=count),
        "clip_frac": masked_mean(clipped, valid, count=count),
        "ratio_mean": masked_mean(ratio, valid, count=count),
    }
