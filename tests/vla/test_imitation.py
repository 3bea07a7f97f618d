"""token_cross_entropy: the SMPO mean of per-token cross-entropy over valid tokens."""

from __future__ import annotations

import math

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


def test_bin_sigma_scores_a_gaussian_target_over_neighbouring_bins():
    """A per-token loop over the written-out Gaussian target; its minimiser spreads over neighbours."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 2, 16, generator=g)
    bins = torch.tensor([[0, 5], [15, 7], [8, 8], [3, 12]])
    loss, _ = token_cross_entropy(logits=logits, bins=bins, bin_sigma=2.0)
    terms = []
    for i in range(4):
        for k in range(2):
            w = torch.tensor([math.exp(-0.5 * ((j - int(bins[i, k])) / 2.0) ** 2) for j in range(16)])
            terms.append(-(w / w.sum() * F.log_softmax(logits[i, k], -1)).sum())
    torch.testing.assert_close(loss, torch.stack(terms).mean(), rtol=1e-5, atol=1e-6)
    # trained to its minimum, the policy's probabilities are the target: the mode is the demonstrated
    # bin and the neighbours within one sigma keep e^-1/2 of its mass (one-hot training leaves them ~0)
    trained = torch.zeros(1, 1, 16, requires_grad=True)
    opt = torch.optim.Adam([trained], lr=0.1)
    for _ in range(500):
        opt.zero_grad()
        token_cross_entropy(logits=trained, bins=torch.tensor([[8]]), bin_sigma=2.0)[0].backward()
        opt.step()
    p = trained.detach().softmax(-1)[0, 0]
    assert int(p.argmax()) == 8
    torch.testing.assert_close(p[10] / p[8], torch.tensor(math.exp(-0.5)), rtol=0.02, atol=0.0)
