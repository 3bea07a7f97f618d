"""Percentile-bootstrap confidence intervals over independent samples (e.g. one value per seed).

Each function resamples its sample(s) with replacement ``n_boot`` times with a numpy
``Generator`` seeded by ``seed`` and reads the interval off the resampled statistics (Efron &
Tibshirani 1993, §13.3). Two samples are resampled independently (independent runs).

A sample may hold ``inf`` (a censored value, e.g. a run that never reached a target: its time is
``inf``): a resample whose mean contains an ``inf`` is ``inf`` too, and :func:`mean_ci` and
:func:`ratio_of_means_ci` pick resampled values themselves as interval ends, so an infinite end says
"not reached in that share of resamples" rather than hiding the censoring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _means(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Row means of ``values[idx]`` [n_boot] with ``inf`` propagated (no ``inf - inf`` NaNs)."""
    sample = values[idx]
    out = np.where(np.isinf(sample).any(axis=1), math.inf, 0.0)
    finite = ~np.isinf(out)
    out[finite] = sample[finite].mean(axis=1)
    return out


def mean_ci(
    values: Sequence[float], *, n_boot: int = 10_000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` [n] and its percentile-bootstrap interval.

    Each of the ``n_boot`` resamples draws ``n`` values with replacement; ``low`` / ``high`` are the
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the resampled means, taken as resampled
    means themselves (numpy's ``"lower"`` / ``"higher"``), so an infinite one stays infinite. An empty
    sample gives NaNs.
    """
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, v.size, size=(n_boot, v.size))
    means = _means(v, idx)
    a = (1 - level) / 2
    # "lower"/"higher" pick resampled means themselves, so an infinite one stays infinite.
    lo, hi = np.quantile(means, a, method="lower"), np.quantile(means, 1 - a, method="higher")
    return float(v.mean()), float(lo), float(hi)


def ratio_of_means_ci(
    num: Sequence[float], den: Sequence[float], *, n_boot: int = 10_000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """``(ratio, low, high)`` of ``mean(num) / mean(den)`` (e.g. a speed-up: the baseline's time over
    a mode's), resampling ``num`` [n] and ``den`` [m] independently (the runs are independent).

    A resample where both means are infinite (both sides censored) is undefined and dropped; the
    interval ends are resampled ratios (``"lower"`` / ``"higher"``). An empty side gives NaNs.
    """
    a_, b_ = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if a_.size == 0 or b_.size == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, a_.size, size=(n_boot, a_.size))
    ib = rng.integers(0, b_.size, size=(n_boot, b_.size))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = _means(a_, ia) / _means(b_, ib)  # inf/inf -> nan: both censored, undefined
    a = (1 - level) / 2
    ratios = ratios[~np.isnan(ratios)]
    if ratios.size == 0:
        return math.nan, math.nan, math.nan
    lo, hi = np.quantile(ratios, a, method="lower"), np.quantile(ratios, 1 - a, method="higher")
    with np.errstate(invalid="ignore", divide="ignore"):
        point = float(np.mean(a_) / np.mean(b_))
    return point, float(lo), float(hi)


def diff_of_means_ci(
    a: Sequence[float], b: Sequence[float], *, n_boot: int = 10_000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """``(diff, low, high)`` of ``mean(a) - mean(b)`` (e.g. final returns of two modes), resampling
    ``a`` [n] and ``b`` [m] independently; the ends are linearly interpolated quantiles of the
    resampled differences (finite values expected). An empty side gives NaNs."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    diffs = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1) - y[
        rng.integers(0, y.size, size=(n_boot, y.size))
    ].mean(axis=1)
    q = (1 - level) / 2
    return float(x.mean() - y.mean()), float(np.quantile(diffs, q)), float(np.quantile(diffs, 1 - q))
