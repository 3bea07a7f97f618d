"""benchmarks.stats.jackknife: the leave-one-out standard errors against closed forms and a naive loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from benchmarks.stats.jackknife import jackknife, jackknife_ratio_difference


def test_jackknife_se_of_the_mean_is_s_over_sqrt_n():
    x = np.random.default_rng(1).normal(2.0, 3.0, size=37)
    closed = x.std(ddof=1) / math.sqrt(x.size)
    generic = jackknife(x, np.mean)
    torch.testing.assert_close(generic.se, closed, rtol=1e-12, atol=0)
    # The paired difference of means: den = 1 per episode, B - A per seed.
    a, b = x[::-1].copy(), x
    ones = np.ones_like(x)
    jk = jackknife_ratio_difference(a, ones, b, ones)
    torch.testing.assert_close(jk.se, (b - a).std(ddof=1) / math.sqrt(x.size), rtol=1e-10, atol=0)
    torch.testing.assert_close(jk.estimate, float(np.mean(b - a)), rtol=0, atol=1e-12)


def test_ratio_jackknife_matches_a_naive_leave_one_out_loop():
    rng = np.random.default_rng(2)
    n = 25
    cols = np.stack(
        [rng.integers(0, 6, n), rng.integers(5, 40, n), rng.integers(0, 6, n), rng.integers(5, 40, n)], 1
    )
    cols = cols.astype(np.float64)

    def stat(rows: np.ndarray) -> float:
        return 100 * (rows[:, 2].sum() / rows[:, 3].sum() - rows[:, 0].sum() / rows[:, 1].sum())

    naive = jackknife(cols, stat)
    fast = jackknife_ratio_difference(cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3], scale=100.0)
    torch.testing.assert_close(fast.se, naive.se, rtol=1e-10, atol=0)
    torch.testing.assert_close(fast.estimate, naive.estimate, rtol=1e-12, atol=0)
    low, high = fast.interval(2.0)
    torch.testing.assert_close(high - low, 4.0 * fast.se, rtol=1e-12, atol=0)


def test_jackknife_refuses_bad_shapes():
    with pytest.raises(ValueError, match=r"equal 1-D shapes \[n\], got \[\(3,\), \(4,\)\]"):
        jackknife_ratio_difference(np.ones(3), np.ones(3), np.ones(4), np.ones(3))
    with pytest.raises(ValueError, match="at least 2"):
        jackknife(np.ones(1), np.mean)
