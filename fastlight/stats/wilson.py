"""The Wilson score interval of a binomial proportion (Wilson 1927), e.g. a success rate."""

from __future__ import annotations

import numpy as np

Z95 = 1.959964  # two-sided 95% normal quantile


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``successes / n`` (closed form).

    ``(p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)`` with ``p = successes / n``; unlike the
    normal (Wald) interval it is never degenerate at 0 or n successes. Returns ``(low, high)``.
    """
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * np.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n)) / denom
    # At 0 (or n) successes the closed form's low (high) end is exactly 0 (1); set it, rather than
    # leave float round-off such as 0.9999999999999999. Clipping removes round-off elsewhere.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return float(low), float(high)
