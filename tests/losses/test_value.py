"""Value loss (plain and PPO2-clipped), entropy bonus and explained variance under SMPO masking."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fastlight.losses import entropy_bonus, explained_variance, value_loss

NAN = float("nan")


def test_value_loss_is_half_mse_over_valid() -> None:
    values = torch.tensor([1.0, 2.0, NAN, 0.0])
    returns = torch.tensor([0.0, 4.0, 1.0, NAN])
    valid = torch.tensor([True, True, False, False])
    assert value_loss(values=values, returns=returns, valid=valid).item() == pytest.approx(0.5 * (1 + 4) / 2)


@pytest.mark.parametrize(
    ("v", "r", "expected", "grad"),
    [
        # unclipped (1-2)²=1, clipped V_c=0.2: (0.2-2)²=3.24 → max=3.24; V_c is clamped so dℓ/dV = 0
        (1.0, 2.0, 0.5 * 3.24, 0.0),
        # unclipped (1-0.5)²=0.25 beats clipped (0.2-0.5)²=0.09 → gradient of the unclipped term
        (1.0, 0.5, 0.5 * 0.25, 0.5),
        # inside the clip range both terms coincide
        (0.1, 1.0, 0.5 * 0.81, -0.9),
    ],
)
def test_clipped_value_loss_hand_values(v: float, r: float, expected: float, grad: float) -> None:
    values = torch.tensor([v], dtype=torch.float64, requires_grad=True)
    loss = value_loss(
        values=values, returns=torch.tensor([r], dtype=torch.float64), valid=torch.tensor([True]),
        old_values=torch.zeros(1, dtype=torch.float64), clip_eps=0.2,
    )  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx(expected)
    assert values.grad.item() == pytest.approx(grad)


def test_clip_eps_changes_behaviour() -> None:
    kw = {"values": torch.tensor([1.0]), "returns": torch.tensor([2.0]), "valid": torch.tensor([True])}
    plain = value_loss(**kw)
    clipped = value_loss(**kw, old_values=torch.zeros(1), clip_eps=0.2)
    assert plain.item() == pytest.approx(0.5) and clipped.item() == pytest.approx(1.62)


def test_clip_eps_requires_old_values() -> None:
    with pytest.raises(ValueError, match="old_values"):
        value_loss(
            values=torch.zeros(2), returns=torch.zeros(2), valid=torch.ones(2, dtype=torch.bool), clip_eps=0.2
        )


def test_value_shape_errors_name_both_shapes() -> None:
    valid = torch.ones(3, dtype=torch.bool)
    with pytest.raises(ValueError) as exc:
        value_loss(values=torch.zeros(3), returns=torch.zeros(3, 1), valid=valid)
    assert "(3,)" in str(exc.value) and "(3, 1)" in str(exc.value)
    with pytest.raises(ValueError) as exc:
        value_loss(
            values=torch.zeros(3),
            returns=torch.zeros(3),
            valid=valid,
            old_values=torch.zeros(4),
            clip_eps=0.1,
        )
    assert "(3,)" in str(exc.value) and "(4,)" in str(exc.value)
    with pytest.raises(ValueError) as exc:
        value_loss(values=torch.zeros(3), returns=torch.zeros(3), valid=torch.ones(2, dtype=torch.bool))
    assert "(2,)" in str(exc.value) and "(3,)" in str(exc.value)


def test_value_loss_count_override() -> None:
    kw = {
        "values": torch.ones(4),
        "returns": torch.zeros(4),
        "valid": torch.tensor([True, True, False, True]),
    }
    assert value_loss(**kw).item() == pytest.approx(0.5)
    assert value_loss(**kw, count=6.0).item() == pytest.approx(0.5 * 3 / 6)


@pytest.mark.parametrize("clip_eps", [None, 0.1])
@pytest.mark.parametrize("n_pad", [1, 5])
def test_padding_leaves_value_loss_and_grads_unchanged(clip_eps: float | None, n_pad: int) -> None:
    torch.manual_seed(0)
    critic = nn.Linear(4, 1).double()
    obs = torch.randn(7, 4, dtype=torch.float64)
    with torch.no_grad():
        old = critic(obs).squeeze(-1) + 0.3 * torch.randn(7, dtype=torch.float64)
    returns = torch.randn(7, dtype=torch.float64)

    def run(obs, returns, old, valid):
        critic.zero_grad()
        loss = value_loss(
            values=critic(obs).squeeze(-1), returns=returns, valid=valid, old_values=old, clip_eps=clip_eps
        )
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in critic.parameters()]

    ref_loss, ref_grads = run(obs, returns, old, torch.ones(7, dtype=torch.bool))
    garbage_obs = 1e3 * torch.randn(n_pad, 4, dtype=torch.float64)  # finite: it is a network input
    nan = torch.full((n_pad,), NAN, dtype=torch.float64)
    perm = torch.randperm(7 + n_pad)
    valid = torch.cat([torch.ones(7, dtype=torch.bool), torch.zeros(n_pad, dtype=torch.bool)])
    loss, grads = run(
        torch.cat([obs, garbage_obs])[perm],
        torch.cat([returns, nan])[perm],
        torch.cat([old, -nan])[perm],
        valid[perm],
    )
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-6)
    for g, ref in zip(grads, ref_grads, strict=True):
        assert ref.abs().sum() > 0
        torch.testing.assert_close(g, ref, rtol=0, atol=1e-6)


def test_entropy_bonus_masked_mean_over_tokens() -> None:
    entropy = torch.tensor([[1.0, 3.0], [NAN, NAN], [5.0, 7.0]], requires_grad=True)
    valid = torch.tensor([True, False, True])
    out = entropy_bonus(entropy=entropy, valid=valid)
    out.backward()
    assert out.item() == pytest.approx(4.0)
    assert torch.equal(entropy.grad, torch.tensor([[0.25, 0.25], [0.0, 0.0], [0.25, 0.25]]))


def test_explained_variance_values() -> None:
    g = torch.Generator().manual_seed(0)
    returns = torch.randn(20, generator=g, dtype=torch.float64)
    values = returns + 0.5 * torch.randn(20, generator=g, dtype=torch.float64)
    valid = torch.rand(20, generator=g) > 0.3
    returns_garbage = torch.where(valid, returns, NAN)
    values_garbage = torch.where(valid, values, float("inf"))
    ev = explained_variance(values=values_garbage, returns=returns_garbage, valid=valid)
    r, v = returns[valid], values[valid]
    expected = 1 - (r - v).var(unbiased=False) / r.var(unbiased=False)
    torch.testing.assert_close(ev, expected)
    assert 0.0 < ev.item() < 1.0

    perfect = explained_variance(values=returns, returns=returns, valid=valid)
    assert perfect.item() == pytest.approx(1.0)
    constant = explained_variance(
        values=torch.full_like(returns, r.mean().item()), returns=returns, valid=valid
    )
    assert constant.item() == pytest.approx(0.0, abs=1e-12)


def test_explained_variance_zero_return_variance_is_zero_not_nan() -> None:
    ones = torch.ones(4)
    valid = torch.tensor([True, True, True, False])
    assert explained_variance(values=torch.zeros(4), returns=ones, valid=valid).item() == 0.0
    assert explained_variance(values=ones, returns=ones, valid=torch.zeros(4, dtype=torch.bool)).item() == 0.0


def test_explained_variance_is_detached() -> None:
    values = torch.randn(5, requires_grad=True)
    ev = explained_variance(values=values, returns=torch.randn(5), valid=torch.ones(5, dtype=torch.bool))
    assert not ev.requires_grad and ev.ndim == 0
