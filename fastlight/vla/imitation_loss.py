"""Token cross-entropy for imitation (SFT on demonstrations, self-imitation of successes), a masked
mean over valid tokens as FAST §SMPO reduces the RL losses. :class:`TokenImitation`, mixed into a token
policy, is its ``imitation_loss``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fastlight.losses.masked import masked_mean
from fastlight.models.base import Obs


def token_cross_entropy(
    *,
    logits: Tensor,
    bins: Tensor,
    valid: Tensor | None = None,
    label_smoothing: float = 0.0,
    bin_sigma: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Masked mean cross-entropy of action bins, and the token accuracy / bin error.

    Shapes: ``logits [N, K, B]`` (K action tokens, B bins), ``bins [N, K]`` long, ``valid`` ``[N]``
    or ``[N, K]`` bool (default all valid). Returns ``(loss [], info)`` with ``token_accuracy``
    (argmax bin = target) and ``bin_error`` (mean absolute distance in bins), both detached.

    ``bin_sigma > 0`` replaces each one-hot target by a Gaussian over the neighbouring bins of that
    width (in bins; the HL-Gauss targets of Imani & White, 2018, Farebrother et al., 2024), so that
    sampling explores actions near the demonstrated one.
    """
    if logits.shape[:-1] != bins.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be bins {tuple(bins.shape)} + [n_bins]")
    valid = torch.ones_like(bins, dtype=torch.bool) if valid is None else valid.bool()
    if valid.dim() == 1:
        valid = valid[:, None].expand_as(bins)
    target: Tensor = bins.flatten()
    if bin_sigma > 0:
        grid = torch.arange(logits.shape[-1], device=bins.device, dtype=torch.float32)
        target = torch.softmax(-0.5 * ((grid - target[:, None].float()) / bin_sigma) ** 2, dim=-1)
    ce = F.cross_entropy(logits.flatten(0, 1), target, reduction="none", label_smoothing=label_smoothing)
    loss = masked_mean(ce.view_as(bins), valid)
    with torch.no_grad():
        pred = logits.argmax(-1)
        info = {
            "token_accuracy": masked_mean((pred == bins).float(), valid),
            "bin_error": masked_mean((pred - bins).abs().float(), valid),
        }
    return loss, info


class TokenImitation:
    """A TokenPolicy's ``imitation_loss``: cross-entropy on the actions' bins (``own``: act's bins)."""

    def imitation_loss(
        self, obs: Obs, actions: Tensor, valid: Tensor | None = None, *, own: bool = False, **targets: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        bins = actions.long() if own else self.action_tokenizer.encode(actions)  # [N, K]
        return token_cross_entropy(logits=self(obs, actions=bins)[0], bins=bins, valid=valid, **targets)
