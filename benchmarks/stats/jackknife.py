"""Leave-one-out jackknife standard errors, for paired comparisons of per-episode metrics (FAST §5).

FAST compares its closed-loop driving metrics between two policies with jackknife 95%
confidence intervals. For a statistic ``θ`` of ``n`` paired episodes, with ``θ_(i)`` the
statistic without pair ``i`` and ``θ_(.)`` their mean (Efron & Tibshirani 1993, §11.2)::

    SE_jack = sqrt((n - 1) / n · Σ_i (θ_(i) - θ_(.))²)

For the mean this is exactly ``s / sqrt(n)`` (``s`` the sample standard deviation with
``n - 1``). The interval is ``θ ± q · SE_jack`` with ``q`` a Student-t quantile with ``n - 1``
degrees of freedom, chosen by the caller.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class JackknifeEstimate:
    """A statistic on all ``n`` samples and its jackknife standard error."""

    estimate: float
    se: float
    n: int

    def interval(self, quantile: float) -> tuple[float, float]:
        """``estimate ± quantile · se`` (e.g. ``scipy.stats.t.ppf(0.975, n - 1)`` for 95%)."""
        return self.estimate - quantile * self.se, self.estimate + quantile * self.se


def _se(leave_one_out: np.ndarray) -> float:
    n = leave_one_out.size
    centred = leave_one_out - leave_one_out.mean()
    return float(math.sqrt((n - 1) / n * float(np.sum(centred * centred))))


def jackknife(samples: np.ndarray, statistic: Callable[[np.ndarray], float]) -> JackknifeEstimate:
    """Jackknife of any ``statistic`` of the rows of ``samples`` [n, ...] (one row per sample).

    Recomputes the statistic ``n`` times; :func:`jackknife_ratio_difference` is the closed form
    for the driving metrics.
    """
    samples = np.asarray(samples)
    n = samples.shape[0]
    if n < 2:
        raise ValueError(f"the jackknife needs at least 2 samples, got {n}")
    keep = np.ones(n, dtype=bool)
    loo = np.empty(n, dtype=np.float64)
    for i in range(n):
        keep[i] = False
        loo[i] = statistic(samples[keep])
        keep[i] = True
    return JackknifeEstimate(float(statistic(samples)), _se(loo), n)


def jackknife_ratio_difference(
    num_a: np.ndarray, den_a: np.ndarray, num_b: np.ndarray, den_b: np.ndarray, scale: float = 1.0
) -> JackknifeEstimate:
    """Jackknife of ``θ = scale · (Σ num_b / Σ den_b - Σ num_a / Σ den_a)`` over paired episodes.

    Element ``i`` of the four arrays [n] belongs to evaluation seed ``i`` (policy A and policy B
    played the same seed), so leaving out ``i`` drops the pair. Each leave-one-out statistic is
    ``(N - num_i) / (D - den_i)``, so this is O(n). A leave-one-out denominator of 0 makes that
    replicate, and so the SE, NaN (the metric is undefined without that episode).
    """
    arrays = [np.asarray(x, dtype=np.float64) for x in (num_a, den_a, num_b, den_b)]
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1 or arrays[0].ndim != 1:
        raise ValueError(f"num_a, den_a, num_b, den_b must be equal 1-D shapes [n], got {sorted(shapes)}")
    na, da, nb, db = arrays
    n = na.size
    if n < 2:
        raise ValueError(f"the jackknife needs at least 2 paired episodes, got {n}")
    with np.errstate(divide="ignore", invalid="ignore"):
        loo = scale * ((nb.sum() - nb) / (db.sum() - db) - (na.sum() - na) / (da.sum() - da))
        full = (
            scale * (nb.sum() / db.sum() - na.sum() / da.sum()) if db.sum() > 0 and da.sum() > 0 else math.nan
        )
    loo = np.where(np.isfinite(loo), loo, np.nan)
    return JackknifeEstimate(float(full), _se(loo), n)
