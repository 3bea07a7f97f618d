"""token_cross_entropy: the SMPO mean of per-token cross-entropy over valid tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fastlight.vla.imitation_loss import token_cross_entropy


def test_equals_the_mean_over_valid_tokens_of_a_per_token_loop():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, 8, generator=g)
    bins = torch.randint(8, (5, 3), generator=g)
    valid = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1], [0, 1, 1]], dtype=torch.bool)
    loss, info = token_cross_entropy(logits=logits, bins=bins, valid=valid)
    terms = [
        F.cross_entropy(logits[i, k][None], bins[i, k][None])
        for i in range(5)
        for k in range(3)
        if valid[i, k]
    ]
    torch.testing.assert_close(loss, torch.stack(terms).mean(), rtol=1e-6, atol=1e-6)
    hits = [float(logits[i, k].argmax() == bins[i, k]) for i in range(5) for k in range(3) if valid[i, k]]
    torch.testing.assert_close(info["token_accuracy"], torch.tensor(sum(hits) / len(hits)))
    # a row mask [N] masks whole steps; no mask is all valid
    row, _ = token_cross_entropy(
        logits=logits, bins=bins, valid=torch.tensor([1, 0, 0, 1, 0], dtype=torch.bool)
    )
    full, _ = token_cross_entropy(logits=logits, bins=bins)
    torch.testing.assert_close(row, F.cross_entropy(logits[[0, 3]].flatten(0, 1), bins[[0, 3]].flatten()))
    torch.testing.assert_close(full, F.cross_entropy(logits.flatten(0, 1), bins.flatten()))


def test_refuses_logits_that_do_not_match_the_bins():
    with pytest.raises(ValueError, match="bins"):
        token_cross_entropy(logits=torch.zeros(4, 3, 8), bins=torch.zeros(4, 2, dtype=torch.long))
