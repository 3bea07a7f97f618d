"""Token cross-entropy for imitation: SFT on demonstrations and self-imitation of successes.

Both train a token policy to put its probability on given action bins. The mean runs over valid
tokens only, as FAST §SMPO reduces the RL losses: a padded or masked token counts neither in the
sum nor in the count.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fastlight.losses.masked import masked_mean


def token_cross_entropy(
    *, logits: Tensor, bins: Tensor, valid: Tensor | None = None, label_smoothing: float = 0.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """Masked mean cross-entropy of action bins, and the token accuracy / bin error.

    Shapes: ``logits [N, K, B]`` (K action tokens, B bins), ``bins [N, K]`` long, ``valid`` ``[N]``
    or ``[N, K]`` bool (default all valid). Returns ``(loss [], info)`` with ``token_accuracy``
    (argmax bin = target) and ``bin_error`` (mean absolute distance in bins), both detached.
    """
    if logits.shape[:-1] != bins.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be bins {tuple(bins.shape)} + [n_bins]")
    valid = torch.ones_like(bins, dtype=torch.bool) if valid is None else valid.bool()
    if valid.dim() == 1:
        valid = valid[:, None].expand_as(bins)
    ce = F.cross_entropy(
        logits.flatten(0, 1), bins.flatten(), reduction="none", label_smoothing=label_smoothing
    ).view_as(bins)
    loss = masked_mean(ce, valid)
    with torch.no_grad():
        pred = logits.argmax(-1)
        info = {
            "token_accuracy": masked_mean((pred == bins).float(), valid),
            "bin_error": masked_mean((pred - bins).abs().float(), valid),
        }
    return loss, info
