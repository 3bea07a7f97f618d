"""Confidence intervals of the benchmark reports: percentile bootstrap over independent samples
(:mod:`.bootstrap`, one value per seed), leave-one-out jackknife standard errors (:mod:`.jackknife`,
FAST §5's paired comparisons) and the paired stratified bootstrap of two policies (:mod:`.paired`).
The intervals of ``fastlight evaluate`` are :mod:`fastlight.stats`."""
