"""The intervals of ``fastlight evaluate``'s reports: a success rate's Wilson score interval, and a mean over
fixed strata (the tasks of a benchmark) with a stratified percentile bootstrap.

The strata are fixed (MT10 is a fixed set of tasks, not a sample of tasks): every resample draws
``n_k`` outcomes with replacement *within* each stratum ``k``, so it keeps the stratum mix. The
statistic is the unweighted mean over strata of the per-stratum means (the MT10 score). Intervals
are the linearly interpolated ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of the
``n_boot`` resampled statistics (Efron & Tibshirani 1993, §13.3), drawn with a numpy ``Generator``
seeded by ``seed``. The benchmark reports' other intervals are ``benchmarks/stats``.
"""

from __future__ import annotations

import numpy as np


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval (Wilson 1927) of a binomial proportion ``successes / n``, e.g. a success rate:
    ``(p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)`` with ``p = successes / n`` and ``z`` the
    two-sided normal quantile (95 %); unlike the normal (Wald) interval it is never degenerate at 0 or n
    successes. Returns ``(low, high)``."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p, z2 = successes / n, z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * np.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n)) / denom
    # At 0 (or n) successes the low (high) end is exactly 0 (1): set, not left to float round-off.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return float(low), float(high)


def check_strata(per_stratum: dict[str, np.ndarray], what: str) -> list[np.ndarray]:
    if not per_stratum:
        raise ValueError(f"{what}: no tasks")
    arrays = [np.asarray(v, dtype=np.float64).reshape(-1) for v in per_stratum.values()]
    if empty := [t for t, a in zip(per_stratum, arrays, strict=True) if a.size == 0]:
        raise ValueError(f"{what}: tasks {empty} have no episodes")
    return arrays


def percentiles(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(samples, [alpha, 1.0 - alpha])
    return float(low), float(high)


def stratified_mean_ci(
    per_stratum: dict[str, np.ndarray], *, n_boot: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Mean over strata of the per-stratum means, with a stratified percentile-bootstrap CI of ``n_boot``
    resamples (a numpy ``Generator`` seeded with ``seed``) covering ``confidence``; returns ``(mean, low,
    high)``. ``per_stratum``: stratum (task) -> outcomes ``[n_k]`` (0/1 or bool for success rates; any
    numbers work, e.g. returns); one stratum gives the plain bootstrap of a mean."""
    arrays = check_strata(per_stratum, "stratified_mean_ci")
    rng = np.random.default_rng(seed)
    boot = np.zeros(n_boot)  # [n_boot], running sum of per-stratum resampled means
    for a in arrays:
        idx = rng.integers(0, a.size, size=(n_boot, a.size))  # [n_boot, n_k]
        boot += a[idx].mean(axis=1)
    boot /= len(arrays)
    mean = float(np.mean([a.mean() for a in arrays]))
    return (mean, *percentiles(boot, confidence))


def ratio_of_sums_ci(
    num: np.ndarray, den: np.ndarray, *, n_boot: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float, float]:
    """``Σ num / Σ den`` over units (episodes) ``[n]``, with a percentile-bootstrap CI that resamples whole
    units, ``num`` and ``den`` together (a per-step rate keeps each episode's steps together). Draws as
    :func:`stratified_mean_ci` does, so with ``den`` all ones both give the same interval. ``(nan,) * 3``
    where ``Σ den == 0``; a resample with ``Σ den == 0`` is undefined and dropped."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if den.sum() <= 0:
        return np.nan, np.nan, np.nan
    idx = np.random.default_rng(seed).integers(0, num.size, size=(n_boot, num.size))  # [n_boot, n]
    nums, dens = num[idx].sum(axis=1), den[idx].sum(axis=1)
    keep = dens > 0
    return (float(num.sum() / den.sum()), *percentiles(nums[keep] / dens[keep], confidence))
