"""Stratified percentile-bootstrap intervals: a mean over fixed strata (e.g. the tasks of a benchmark).

The strata are fixed (MT10 is a fixed set of tasks, not a sample of tasks): every resample draws
``n_k`` outcomes with replacement *within* each stratum ``k``, so it keeps the stratum mix. The
statistic is the unweighted mean over strata of the per-stratum means (the MT10 score). Intervals
are the linearly interpolated ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of the
``n_boot`` resampled statistics (Efron & Tibshirani 1993, §13.3), drawn with a numpy ``Generator``
seeded by ``seed``.
"""

from __future__ import annotations

import numpy as np


def _check_strata(per_stratum: dict[str, np.ndarray], what: str) -> list[np.ndarray]:
    if not per_stratum:
        raise ValueError(f"{what}: no tasks")
    arrays = [np.asarray(v, dtype=np.float64).reshape(-1) for v in per_stratum.values()]
    empty = [t for t, a in zip(per_stratum, arrays, strict=True) if a.size == 0]
    if empty:
        raise ValueError(f"{what}: tasks {empty} have no episodes")
    return arrays


def _percentiles(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(samples, [alpha, 1.0 - alpha])
    return float(low), float(high)


def stratified_mean_ci(
    per_stratum: dict[str, np.ndarray],
    *,
    n_boot: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """Mean over strata of the per-stratum means, with a stratified percentile-bootstrap CI.

    Args:
        per_stratum: stratum (task) -> outcomes ``[n_k]`` (0/1 or bool for success rates; any
            numbers work, e.g. returns). One stratum gives the plain bootstrap of a mean.
        n_boot: bootstrap resamples.
        seed: seed of the numpy ``Generator``.
        confidence: coverage of the interval.

    Returns ``(mean, low, high)``.
    """
    arrays = _check_strata(per_stratum, "stratified_mean_ci")
    rng = np.random.default_rng(seed)
    boot = np.zeros(n_boot)  # [n_boot], running sum of per-stratum resampled means
    for a in arrays:
        idx = rng.integers(0, a.size, size=(n_boot, a.size))  # [n_boot, n_k]
        boot += a[idx].mean(axis=1)
    boot /= len(arrays)
    mean = float(np.mean([a.mean() for a in arrays]))
    return (mean, *_percentiles(boot, confidence))


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
        n_boot, seed, confidence: as :func:`stratified_mean_ci`.

    Each resample draws one set of indices per stratum and applies it to *both* sides, so the
    interval reflects the per-pair differences (seeds that are hard for both cancel).
    Returns ``(diff, low, high)``.
    """
    if set(a) != set(b):
        raise ValueError(f"paired_diff_ci: a and b have different tasks ({sorted(a)} vs {sorted(b)})")
    xs = _check_strata(a, "paired_diff_ci")
    ys = _check_strata({t: b[t] for t in a}, "paired_diff_ci")
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
    return (diff, *_percentiles(boot, confidence))
