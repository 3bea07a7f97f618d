"""Confidence intervals that fastlight's reports and users' own analyses share.

- :mod:`~fastlight.stats.bootstrap`: percentile bootstrap over independent samples (one value per
  seed): :func:`mean_ci`, :func:`ratio_of_means_ci`, :func:`diff_of_means_ci`;
- :mod:`~fastlight.stats.stratified`: a mean over fixed strata (tasks): :func:`stratified_mean_ci`,
  and the paired difference of two such means, :func:`paired_diff_ci`;
- :mod:`~fastlight.stats.wilson`: :func:`wilson_interval` of a success rate;
- :mod:`~fastlight.stats.jackknife`: leave-one-out standard errors (FAST §5's paired comparisons).
"""

from fastlight.stats.bootstrap import diff_of_means_ci, mean_ci, ratio_of_means_ci
from fastlight.stats.jackknife import JackknifeEstimate, jackknife, jackknife_ratio_difference
from fastlight.stats.stratified import paired_diff_ci, stratified_mean_ci
from fastlight.stats.wilson import Z95, wilson_interval

__all__ = [
    "JackknifeEstimate",
    "Z95",
    "diff_of_means_ci",
    "jackknife",
    "jackknife_ratio_difference",
    "mean_ci",
    "paired_diff_ci",
    "ratio_of_means_ci",
    "stratified_mean_ci",
    "wilson_interval",
]
