"""benchmarks.stats.paired: the paired, stratified bootstrap of the difference of two policies."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.stats.paired import paired_diff_ci


def _tasks(rates: list[float], n: int) -> dict[str, np.ndarray]:
    """Task -> ``n`` outcomes with exactly ``round(rate * n)`` successes, deterministic order."""
    return {f"t{i}": (np.arange(n) < round(r * n)).astype(float) for i, r in enumerate(rates)}


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
