"""Statistics of the convergence benchmark: time to a target return, and percentile-bootstrap
confidence intervals over seeds (for a mean, and for a ratio of two modes' means).

A run that never reaches the target has time ``inf`` (censored at its budget); a resample whose
mean contains an ``inf`` is ``inf`` too, so an interval with an infinite end says "not reached in
that share of resamples" rather than hiding the censoring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def time_to_target(times: Sequence[float], returns: Sequence[float], target: float) -> float:
    """The first evaluation time whose return is at least ``target``; ``inf`` if none.

    ``times`` must be increasing (training wall-clock of each snapshot, evaluation excluded).
    """
    t = np.asarray(times, dtype=float)
    r = np.asarray(returns, dtype=float)
    if t.shape != r.shape:
        raise ValueError(f"times and returns differ in length: {t.shape} vs {r.shape}")
    if np.any(np.diff(t) < 0):
        raise ValueError("times must be increasing")
    hit = np.flatnonzero(r >= target)
    return float(t[hit[0]]) if hit.size else math.inf


def _means(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Row means of ``values[idx]`` with ``inf`` propagated (no ``inf - inf`` NaNs)."""
    sample = values[idx]
    out = np.where(np.isinf(sample).any(axis=1), math.inf, 0.0)
    finite = ~np.isinf(out)
    out[finite] = sample[finite].mean(axis=1)
    return out


def bootstrap_mean_ci(
    values: Sequence[float], *, n_boot: int = 10_000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean over seeds and its percentile-bootstrap interval."""
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


def bootstrap_ratio_ci(
    num: Sequence[float], den: Sequence[float], *, n_boot: int = 10_000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """``(ratio, low, high)`` of ``mean(num) / mean(den)`` (e.g. a speed-up: the baseline's time over
    the mode's), resampling the seeds of each side independently (the runs are independent)."""
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


def bootstrap_diff_ci(
    a: Sequence[float], b: Sequence[float], *, n_boot: int = 10_000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """``(diff, low, high)`` of ``mean(a) - mean(b)`` (e.g. final returns of two modes), resampling
    the seeds of each side independently."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    diffs = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1) - y[
        rng.integers(0, y.size, size=(n_boot, y.size))
    ].mean(axis=1)
    q = (1 - level) / 2
    return float(x.mean() - y.mean()), float(np.quantile(diffs, q)), float(np.quantile(diffs, 1 - q))


Curve = tuple[Sequence[float], Sequence[float]]  # (times, returns) of one run's snapshots


def race_to_peer_final(
    modes: dict[str, Sequence[Curve]], peer: Sequence[Curve], *, budget_s: float
) -> dict[str, Any]:
    """Does fastlight reach the peer's final return sooner than the peer does?

    The peer's final return is the mean over its seeds of each run's last snapshot. Every run (each
    mode's and the peer's own) gets its :func:`time_to_target` of it; a mode's time is the mean over
    its seeds (``inf`` if a seed never got there). The best mode is the one with the smallest mean
    time (first listed on a tie). ``speedup`` = the peer's time / the best mode's, with both sides
    censored at ``budget_s`` for the bootstrap, as the speed-ups between modes; ``bound`` is ``">="``
    when only the peer never got there, ``"<="`` when only fastlight never did. ``met`` is whether the
    best mode got there strictly sooner (``None``: neither side ever did).
    """
    if not peer or not any(modes.values()):
        raise ValueError("race_to_peer_final needs at least one peer run and one fastlight run")
    final = float(np.mean([float(r[-1]) for _, r in peer]))
    times = {m: [time_to_target(t, r, final) for t, r in runs] for m, runs in modes.items() if runs}
    peer_times = [time_to_target(t, r, final) for t, r in peer]
    mean_t = {m: float(np.mean(v)) for m, v in times.items()}  # inf if any seed is inf
    best = min(mean_t, key=lambda m: mean_t[m])  # min keeps the first of equal values
    f_inf, p_inf = math.isinf(mean_t[best]), any(map(math.isinf, peer_times))
    censor = lambda v: [min(x, budget_s) for x in v]  # noqa: E731
    speedup = (
        (math.nan,) * 3 if f_inf and p_inf else bootstrap_ratio_ci(censor(peer_times), censor(times[best]))
    )
    return {
        "peer_final": final,
        "times": times,
        "best_mode": best,
        "best_time": bootstrap_mean_ci(times[best]),
        "peer_time": bootstrap_mean_ci(peer_times),
        "speedup": speedup,
        "bound": ">=" if p_inf and not f_inf else "<=" if f_inf and not p_inf else "",
        "met": None if f_inf and p_inf else mean_t[best] < float(np.mean(peer_times)),
    }
