"""The convergence benchmark's race: time to a target return, and whether fastlight reaches the peer's
final return sooner than the peer does.

A run that never reaches the target has time ``inf`` (censored at its budget); the intervals over
seeds are :mod:`benchmarks.stats.bootstrap`'s, which keep such an ``inf`` visible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.stats.bootstrap import mean_ci, ratio_of_means_ci


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
        (math.nan,) * 3 if f_inf and p_inf else ratio_of_means_ci(censor(peer_times), censor(times[best]))
    )
    return {
        "peer_final": final,
        "times": times,
        "best_mode": best,
        "best_time": mean_ci(times[best]),
        "peer_time": mean_ci(peer_times),
        "speedup": speedup,
        "bound": ">=" if p_inf and not f_inf else "<=" if f_inf and not p_inf else "",
        "met": None if f_inf and p_inf else mean_t[best] < float(np.mean(peer_times)),
    }
