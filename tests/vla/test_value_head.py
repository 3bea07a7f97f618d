"""ActionAwareValueHead (AcceRL §value head): detached pooling, step embedding, gradient isolation."""

from __future__ import annotations

import pytest
import torch

from fastlight.vla.policy import VLAPolicy
from fastlight.vla.value_heads import ActionAwareValueHead

TINY = {"vocab_size": 600, "hidden_size": 32, "intermediate_size": 64, "n_bins": 32, "image_size": 16,
        "patch_size": 8, "proprio_dim": 3, "max_episode_steps": 50, "value_mlp_hidden": 16}  # fmt: skip


def _obs(n: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "image": torch.randint(0, 256, (n, 16, 16, 3), dtype=torch.uint8, generator=g),
        "proprio": torch.randn(n, 3, generator=g),
        "instruction_ids": torch.randint(3, 500, (n, 5), generator=g),
        "instruction_mask": torch.tensor([[1, 1, 1, 0, 0]] * n),
    }


def test_shapes_and_detach() -> None:
    head = ActionAwareValueHead(hidden_size=8, max_episode_steps=10, mlp_hidden=16)
    hidden = torch.randn(5, 4, 8, requires_grad=True)
    v = head(hidden, torch.arange(5))
    assert v.shape == (5,)
    v.sum().backward()
    assert hidden.grad is None
    assert all(p.grad is not None for p in head.parameters())


def test_step_embedding_changes_value_and_clamps() -> None:
    torch.manual_seed(0)
    head = ActionAwareValueHead(hidden_size=8, max_episode_steps=10)
    with torch.no_grad():  # rows of unit scale (the init's 0.02 makes step differences ~1e-4)
        head.step_embedding.weight.normal_(std=1.0)
    hidden = torch.randn(1, 3, 8).expand(3, -1, -1)
    v = head(hidden, torch.tensor([0, 9, 10_000]))
    # Rows 1 and 2 of one batch may go through different SIMD lanes or GEMM tails, so they are
    # compared with a tolerance (1e-6), far below what a wrong step would change: steps 0 and 9
    # differ by > 1e-3 here, so a clamp to any other step, or none, fails.
    assert (v[0] - v[1]).abs() > 1e-3
    torch.testing.assert_close(v[1], v[2], rtol=0, atol=1e-6)  # beyond the table: clamped to the last step
    # step=None means step 0. Same shapes, same kernels: equal up to 1e-6 (step 9 is > 1e-3 away).
    torch.testing.assert_close(head(hidden[:1]), head(hidden[:1], torch.tensor([0])), rtol=0, atol=1e-6)
    assert (head(hidden[:1]) - head(hidden[:1], torch.tensor([9]))).abs() > 1e-3


def test_attention_pooling_weights_tokens() -> None:
    torch.manual_seed(0)
    head = ActionAwareValueHead(hidden_size=4, max_episode_steps=2)
    with torch.no_grad():
        head.score.weight.zero_()
    hidden = torch.randn(2, 3, 4)
    # Equal scores: a plain mean, up to float32 rounding of softmax(0) = 1/3 (tolerance 1e-6; a
    # pooling that ignored the scores' softmax, e.g. a sum, is off by ~2x the mean).
    torch.testing.assert_close(head.pool(hidden), hidden.mean(1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("hidden", "step"),
    [(torch.randn(2, 8), None), (torch.randn(2, 3, 7), None), (torch.randn(2, 3, 8), torch.zeros(3))],
)
def test_wrong_shapes_raise(hidden: torch.Tensor, step: torch.Tensor | None) -> None:
    with pytest.raises(ValueError, match="shape"):
        ActionAwareValueHead(8, 10)(hidden, step)


@pytest.mark.parametrize("decoding", ["parallel", "autoregressive"])
def test_value_loss_does_not_reach_the_policy(decoding: str) -> None:
    torch.manual_seed(0)
    policy = VLAPolicy(decoding=decoding, **TINY)
    obs, step = _obs(), torch.tensor([0, 3, 7])
    actions = policy.act(obs, step=step).actions
    values = policy.evaluate(obs, actions, step=step).values
    value_loss = ((values - torch.tensor([1.0, -1.0, 0.5])) ** 2).mean()
    value_loss.backward()
    for name, p in policy.named_parameters():
        if name.startswith("value_head."):
            continue
        assert p.grad is None or not bool(p.grad.any()), name
    grads = [p.grad for p in policy.value_parameters()]
    assert all(g is not None and bool(g.any()) for g in grads)


def test_parameter_groups_partition_the_module() -> None:
    policy = VLAPolicy(**TINY)
    pol, val = policy.policy_parameters(), policy.value_parameters()
    ids = {id(p) for p in pol} | {id(p) for p in val}
    assert len(ids) == len(pol) + len(val) == len(list(policy.parameters()))
    assert {id(p) for p in val} == {id(p) for p in policy.value_head.parameters()}
    assert any(p is policy.backbone.get_input_embeddings().weight for p in pol)


def test_value_method_trains_only_the_head() -> None:
    policy = VLAPolicy(**TINY)
    v = policy.value(_obs(), step=torch.tensor([1, 2, 3]))
    v.sum().backward()
    assert all(p.grad is None for p in policy.policy_parameters())
    assert all(p.grad is not None for p in policy.value_parameters())


def test_checkpoint_with_the_old_score_bias_loads_unchanged() -> None:
    # The score had a bias once: softmax is shift-invariant, so it never changed a value and its
    # gradient was zero by mathematics. A state dict that still holds it loads, strictly, to the same head.
    torch.manual_seed(0)
    head = ActionAwareValueHead(hidden_size=8, max_episode_steps=5, mlp_hidden=16)
    old = {**head.state_dict(), "score.bias": torch.tensor([3.0])}
    fresh = ActionAwareValueHead(hidden_size=8, max_episode_steps=5, mlp_hidden=16)
    fresh.load_state_dict(old, strict=True)
    hidden, step = torch.randn(4, 3, 8), torch.tensor([0, 1, 2, 9])
    torch.testing.assert_close(fresh(hidden, step), head(hidden, step), rtol=0, atol=0)
    assert "score.bias" not in fresh.state_dict()
