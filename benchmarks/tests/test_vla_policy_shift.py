"""benchmarks.vla.policy_shift: argmax changes and entropies against a per-token loop."""

from __future__ import annotations

import copy

import torch

from benchmarks.vla.policy_shift import shift
from fastlight.vla.policy import VLAPolicy

TINY = {
    "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "n_bins": 16,
    "proprio_dim": 3, "value_mlp_hidden": 8,
}  # fmt: skip


def test_shift_counts_changed_argmax_tokens_like_a_loop():
    torch.manual_seed(0)
    ref = VLAPolicy(**TINY).eval()
    moved = copy.deepcopy(ref)
    with torch.no_grad():
        moved.backbone.get_output_embeddings().weight.add_(
            0.5 * torch.randn_like(moved.backbone.lm_head.weight)
        )
    obs = {"proprio": torch.randn(40, 3), "instruction_ids": torch.randint(3, 250, (40, 5))}
    assert shift(ref, ref, obs)["changed"] == 0.0
    r = shift(ref, moved, obs)
    with torch.no_grad():
        a, b = ref(obs)[0].argmax(-1), moved(obs)[0].argmax(-1)
    n, k = a.shape
    changed = [[int(a[i, j] != b[i, j]) for i in range(n)] for j in range(k)]
    assert abs(r["changed"] - sum(map(sum, changed)) / (n * k)) < 1e-6  # a float32 mean
    assert 0 < r["changed"] < 1
    assert r["changed_per_dim"] == [round(sum(c) / n, 3) for c in changed]
    far = sum(int(abs(int(a[i, j]) - int(b[i, j])) > 2) for i in range(n) for j in range(k)) / (n * k)
    assert abs(r["changed_by_more_than_2_bins"] - far) < 1e-6
    assert 0 < r["entropy"] < torch.log(torch.tensor(16.0)).item() + 1e-6
