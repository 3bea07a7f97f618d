"""benchmarks.stats.bootstrap: the intervals over independent samples against naive loops, and censoring."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.stats.bootstrap import diff_of_means_ci, mean_ci, ratio_of_means_ci


def _naive_quantile_lower_higher(xs: list[float], level: float) -> tuple[float, float]:
    xs = sorted(xs)
    n, a = len(xs), (1 - level) / 2
    return xs[math.floor(a * (n - 1))], xs[math.ceil((1 - a) * (n - 1))]


def test_bootstrap_mean_ci_matches_a_naive_loop() -> None:
    values = [12.0, 30.0, 18.0, 25.0, 9.0]
    n_boot = 2000
    point, lo, hi = mean_ci(values, n_boot=n_boot, seed=3)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, len(values), size=(n_boot, len(values)))
    means = []
    for row in idx:  # one resample at a time, in plain Python
        total = 0.0
        for i in row:
            total += values[i]
        means.append(total / len(row))
    want_lo, want_hi = _naive_quantile_lower_higher(means, 0.95)
    assert point == pytest.approx(np.mean(values))
    assert (lo, hi) == pytest.approx((want_lo, want_hi), rel=1e-12)
    assert min(values) <= lo < point < hi <= max(values)


def test_bootstrap_keeps_censored_runs_infinite() -> None:
    point, lo, hi = mean_ci([10.0, math.inf, 20.0], n_boot=500)
    assert math.isinf(point) and math.isinf(hi) and lo == pytest.approx(10.0)
    assert mean_ci([5.0], n_boot=100) == (5.0, 5.0, 5.0)  # one seed: a point


def test_ratio_and_difference_cis_match_naive_loops() -> None:
    a, b = [40.0, 50.0, 45.0], [20.0, 30.0, 25.0, 22.0]
    n_boot = 1000
    r, rlo, rhi = ratio_of_means_ci(a, b, n_boot=n_boot, seed=1)
    rng = np.random.default_rng(1)
    ia = rng.integers(0, len(a), size=(n_boot, len(a)))
    ib = rng.integers(0, len(b), size=(n_boot, len(b)))
    ratios = [
        sum(a[i] for i in ra) / len(ra) / (sum(b[i] for i in rb) / len(rb))
        for ra, rb in zip(ia, ib, strict=True)
    ]
    assert r == pytest.approx(np.mean(a) / np.mean(b))
    assert (rlo, rhi) == pytest.approx(_naive_quantile_lower_higher(ratios, 0.95), rel=1e-12)
    d, dlo, dhi = diff_of_means_ci(a, b, n_boot=n_boot, seed=1)
    diffs = [
        sum(a[i] for i in ra) / len(ra) - sum(b[i] for i in rb) / len(rb)
        for ra, rb in zip(ia, ib, strict=True)
    ]
    assert d == pytest.approx(np.mean(a) - np.mean(b))
    assert (dlo, dhi) == pytest.approx(tuple(np.quantile(diffs, [0.025, 0.975])), rel=1e-12)
    assert dlo < d < dhi


def test_empty_samples_give_nans() -> None:
    for ci in (mean_ci([]), ratio_of_means_ci([], [1.0]), diff_of_means_ci([1.0], [])):
        assert all(math.isnan(x) for x in ci)
    # Both sides censored in every resample: the ratio is undefined, not a number.
    assert all(math.isnan(x) for x in ratio_of_means_ci([math.inf], [math.inf], n_boot=10))
