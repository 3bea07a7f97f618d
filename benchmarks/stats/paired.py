"""The paired, stratified percentile bootstrap of the difference of two means over tasks."""

from __future__ import annotations

import numpy as np

from fastlight.stats import check_strata, percentiles


def paired_diff_ci(
    a: dict[str, np.ndarray],
    b: dict[str, np.ndarray],
    *,
    n_boot: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """``mean_over_strata(b) - mean_over_strata(a)`` with a paired, stratified percentile-bootstrap CI.

    Args:
        a, b: stratum (task) -> outcomes ``[n_k]``; the same strata, and outcome ``i`` of a stratum
            in ``a`` paired with outcome ``i`` in ``b`` (e.g. two policies played with the same seed).
        n_boot, seed, confidence: as :func:`fastlight.stats.stratified_mean_ci`.

    Each resample draws one set of indices per stratum and applies it to *both* sides, so the
    interval reflects the per-pair differences (seeds that are hard for both cancel).
    Returns ``(diff, low, high)``.
    """
    if set(a) != set(b):
        raise ValueError(f"paired_diff_ci: a and b have different tasks ({sorted(a)} vs {sorted(b)})")
    xs = check_strata(a, "paired_diff_ci")
    ys = check_strata({t: b[t] for t in a}, "paired_diff_ci")
    for task, x, y in zip(a, xs, ys, strict=True):
        if x.size != y.size:
            raise ValueError(f"paired_diff_ci: task {task!r} has {x.size} episodes in a, {y.size} in b")
    rng = np.random.default_rng(seed)
    boot = np.zeros(n_boot)  # [n_boot]
    for x, y in zip(xs, ys, strict=True):
        d = y - x  # [n_k] per-pair differences; resampled as pairs
        idx = rng.integers(0, d.size, size=(n_boot, d.size))
        boot += d[idx].mean(axis=1)
    boot /= len(xs)
    diff = float(np.mean([(y - x).mean() for x, y in zip(xs, ys, strict=True)]))
    return (diff, *percentiles(boot, confidence))
