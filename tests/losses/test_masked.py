"""SMPO masked reductions: values, exact-zero gradients through NaN padding, DDP count override."""

from __future__ import annotations

import pytest
import torch

from fastlight.losses.masked import masked_mean, masked_sum, masked_var, zero_invalid

NAN = float("nan")


def test_masked_sum_and_mean_values() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, NAN, float("inf")])
    mask = torch.tensor([True, True, True, False, False])
    assert masked_sum(x, mask).item() == 6.0
    assert masked_mean(x, mask).item() == 2.0


def test_nan_padding_has_zero_gradient() -> None:
    x = torch.tensor([1.0, 2.0, NAN, -float("inf")], requires_grad=True)
    mask = torch.tensor([True, True, False, False])
    masked_mean(x * 3.0, mask).backward()
    assert torch.equal(x.grad, torch.tensor([1.5, 1.5, 0.0, 0.0]))


def test_multiplicative_masking_would_leak_nan() -> None:
    # Documents why the implementation uses torch.where: 0·NaN is NaN.
    x = torch.tensor([1.0, NAN])
    assert torch.isnan((x * torch.tensor([1.0, 0.0])).sum())
    assert masked_sum(x, torch.tensor([True, False])).item() == 1.0


def test_row_mask_broadcasts_over_trailing_axis() -> None:
    x = torch.arange(12.0).reshape(3, 4)
    x[1] = NAN
    mask = torch.tensor([True, False, True])
    expected = (x[0].sum() + x[2].sum()) / 8.0  # count = Σmask·K = 2·4
    assert masked_mean(x, mask).item() == pytest.approx(expected.item())
    assert masked_sum(x, mask).item() == pytest.approx((x[0].sum() + x[2].sum()).item())


def test_full_mask_same_shape() -> None:
    x = torch.tensor([[1.0, NAN], [3.0, 5.0]])
    mask = torch.tensor([[True, False], [True, True]])
    assert masked_mean(x, mask).item() == pytest.approx(3.0)


def test_all_invalid_gives_zero_not_nan() -> None:
    x = torch.tensor([NAN, NAN], requires_grad=True)
    mask = torch.zeros(2, dtype=torch.bool)
    out = masked_mean(x, mask)
    out.backward()
    assert out.item() == 0.0
    assert torch.equal(x.grad, torch.zeros(2))


def test_count_override_units_are_mask_entries() -> None:
    x = torch.ones(3, 4)
    mask = torch.tensor([True, True, False])
    # count replaces Σmask; the K=4 broadcast factor still applies: 8 / (0.5·4) = 4.
    assert masked_mean(x, mask, count=0.5).item() == pytest.approx(4.0)
    assert masked_mean(x, mask, count=torch.tensor(4.0)).item() == pytest.approx(0.5)
    # A zero count is treated as 1 rather than dividing by zero.
    assert masked_mean(x, mask, count=0).item() == pytest.approx(2.0)


def test_count_override_gives_exact_global_mean_under_ddp_averaging() -> None:
    """Two 'ranks' with uneven valid counts: averaging per-rank losses and gradients (what DDP does)
    reproduces the global SMPO mean only with count = global_count / world_size."""
    torch.manual_seed(0)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    shards = [torch.randn(5, 3, dtype=torch.float64), torch.randn(9, 3, dtype=torch.float64)]
    masks = [torch.tensor([True, False, True, False, False]), torch.ones(9, dtype=torch.bool)]
    world, global_count = 2, sum(int(m.sum()) for m in masks)

    x_all, m_all = torch.cat(shards), torch.cat(masks)
    ref = masked_mean((x_all @ w).square(), m_all)
    (ref_grad,) = torch.autograd.grad(ref, w)

    def ddp_average(count: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        losses = [masked_mean((x @ w).square(), m, count=count) for x, m in zip(shards, masks, strict=True)]
        grads = [torch.autograd.grad(loss, w)[0] for loss in losses]
        return sum(losses) / world, sum(grads) / world

    loss, grad = ddp_average(global_count / world)
    torch.testing.assert_close(loss, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-12)
    naive_loss, _ = ddp_average(None)  # local means: biased towards the rank with fewer samples
    assert abs(naive_loss.item() - ref.item()) > 1e-3


def test_masked_var_matches_population_variance() -> None:
    x = torch.tensor([1.0, 4.0, NAN, 7.0, 100.0])
    mask = torch.tensor([True, True, False, True, False])
    expected = torch.tensor([1.0, 4.0, 7.0]).var(unbiased=False)
    assert masked_var(x, mask).item() == pytest.approx(expected.item())


def test_zero_invalid_exact_zeros() -> None:
    x = torch.tensor([[NAN, 1.0], [2.0, float("inf")]])
    out = zero_invalid(x, torch.tensor([False, True]))
    assert torch.equal(out, torch.tensor([[0.0, 0.0], [2.0, float("inf")]]))


@pytest.mark.parametrize(
    ("x_shape", "mask_shape"),
    [((3, 4), (4,)), ((3, 4), (3, 2)), ((3,), (3, 1)), ((2, 3), (3,))],
)
def test_shape_mismatch_names_both_shapes(x_shape: tuple[int, ...], mask_shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError) as err:
        masked_mean(torch.zeros(x_shape), torch.ones(mask_shape, dtype=torch.bool))
    assert str(x_shape) in str(err.value) and str(mask_shape) in str(err.value)


def test_non_bool_mask_rejected() -> None:
    with pytest.raises(ValueError, match="bool"):
        masked_sum(torch.zeros(3), torch.ones(3))
