"""fastlight.stats.stratified: the stratified bootstrap of a mean over tasks, and the paired difference."""

from __future__ import annotations

import numpy as np
import pytest

from fastlight.stats.stratified import paired_diff_ci, stratified_mean_ci


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


def test_paired_diff_of_identical_policies_is_exactly_zero():
    a = _tasks([0.2, 0.5, 0.9], 10)
    assert paired_diff_ci(a, {k: v.copy() for k, v in a.items()}) == (0.0, 0.0, 0.0)


def test_paired_diff_of_one_extra_success_per_task_is_positive():
    n = 10
    a = _tasks([0.2, 0.5, 0.7], n)
    b = {k: v.copy() for k, v in a.items()}
    for v in b.values():
        v[np.flatnonzero(v == 0)[0]] = 1.0  # one more success per task, same seeds otherwise
    diff, low, high = paired_diff_ci(a, b, n_boot=4000)
    assert diff == pytest.approx(1 / n)
    assert 0 <= low <= diff <= high
    # Pairing matters: the unpaired intervals of the two means overlap heavily, yet the paired
    # difference is never negative (no episode got worse).
    assert paired_diff_ci(b, a, n_boot=4000)[0] == pytest.approx(-1 / n)


def test_paired_diff_refuses_unpaired_input():
    with pytest.raises(ValueError, match="different tasks"):
        paired_diff_ci({"x": np.ones(3)}, {"y": np.ones(3)})
    with pytest.raises(ValueError, match="3 episodes in a, 4 in b"):
        paired_diff_ci({"x": np.ones(3)}, {"x": np.ones(4)})
