"""fastlight.stats: the Wilson interval against its closed form and published values, and the stratified
bootstrap of a mean over tasks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastlight.stats import ratio_of_sums_ci, stratified_mean_ci, wilson_interval


def _tasks(rates: list[float], n: int) -> dict[str, np.ndarray]:
    """Task -> ``n`` outcomes with exactly ``round(rate * n)`` successes, deterministic order."""
    return {f"t{i}": (np.arange(n) < round(r * n)).astype(float) for i, r in enumerate(rates)}


def test_bootstrap_of_constant_data_is_a_point():
    assert stratified_mean_ci(_tasks([1.0, 1.0, 1.0], 5)) == (1.0, 1.0, 1.0)
    assert stratified_mean_ci(_tasks([0.0, 0.0], 7)) == (0.0, 0.0, 0.0)


def test_bootstrap_ci_contains_the_mean_and_narrows_with_more_episodes():
    rates = [0.2, 0.5, 0.8, 0.6]
    mean, low, high = stratified_mean_ci(_tasks(rates, 10), n_boot=4000, seed=1)
    assert mean == pytest.approx(np.mean(rates))
    assert low < mean < high
    mean4, low4, high4 = stratified_mean_ci(_tasks(rates, 40), n_boot=4000, seed=1)
    assert mean4 == pytest.approx(mean)
    assert low4 < mean4 < high4
    # The standard error shrinks as 1/sqrt(n): 4x the episodes, about half the width.
    assert (high4 - low4) < 0.7 * (high - low)


def test_bootstrap_is_reproducible_and_task_stratified():
    data = _tasks([0.3, 0.7], 10)
    assert stratified_mean_ci(data, seed=3) == stratified_mean_ci(data, seed=3)
    # Tasks of different sizes each keep their own size: one task at 1.0 with 2 episodes, one at
    # 0.0 with 50 -> the mean over tasks is 0.5, never the pooled 2/52.
    mean, low, high = stratified_mean_ci({"a": np.ones(2), "b": np.zeros(50)})
    assert (mean, low, high) == (0.5, 0.5, 0.5)


Z = 1.959964  # the two-sided 95% normal quantile


def test_wilson_matches_the_closed_form():
    k, n = 8, 10
    p = k / n
    centre = (p + Z**2 / (2 * n)) / (1 + Z**2 / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z**2 / (4 * n**2)) / (1 + Z**2 / n)
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(centre - half, abs=1e-12)
    assert high == pytest.approx(centre + half, abs=1e-12)
    assert (low, high) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # the textbook 8/10 interval


def test_wilson_at_zero_and_all_successes():
    low, high = wilson_interval(0, 10)
    assert low == 0.0
    assert high == pytest.approx(0.2775, abs=1e-4)  # published: 0 of 10 -> [0, 0.278]
    low, high = wilson_interval(10, 10)  # symmetric
    assert high == 1.0
    assert low == pytest.approx(1 - 0.2775, abs=1e-4)


def test_wilson_refuses_impossible_counts():
    for k, n in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError, match="wilson_interval"):
            wilson_interval(k, n)


def test_ratio_of_sums_resamples_whole_units():
    # Unit 2 has no denominator: a resample of it alone is undefined and dropped; every other resample
    # holds unit 1's pair (2 / 2) whole, so the interval is a point (resampling num and den apart: not).
    assert ratio_of_sums_ci(np.array([2.0, 0.0]), np.array([2.0, 0.0]), n_boot=500) == (1.0, 1.0, 1.0)
    value, low, high = ratio_of_sums_ci(np.array([1.0, 9.0, 0.0]), np.array([2.0, 3.0, 5.0]), seed=3)
    assert value == 1.0 and 0.0 <= low < 1.0 < high <= 3.0  # 10 / 10; single units range 0 .. 3
    assert all(math.isnan(x) for x in ratio_of_sums_ci(np.ones(3), np.zeros(3)))  # not in this scene


def test_ratio_of_sums_over_unit_denominators_is_the_bootstrap_of_the_mean():
    x = np.random.default_rng(0).normal(size=17)
    ratio = ratio_of_sums_ci(x, np.ones(17), n_boot=3000, seed=9)
    np.testing.assert_allclose(ratio, stratified_mean_ci({"all": x}, n_boot=3000, seed=9), rtol=1e-12)
