"""fastlight.stats.wilson: the Wilson score interval against its closed form and published values."""

from __future__ import annotations

import math

import pytest

from fastlight.stats import Z95
from fastlight.stats.wilson import wilson_interval

Z = 1.959964


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


def test_z95_is_the_two_sided_95_percent_normal_quantile():
    assert Z95 == Z
    assert 0.5 * math.erfc(-Z95 / math.sqrt(2)) == pytest.approx(0.975, abs=1e-7)
