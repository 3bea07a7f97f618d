"""The throughput family of FAST (§Problem Definition) as one torchmetrics ``Metric``.

FAST splits *effective throughput* (valid on-policy transitions per second) into three
factors. From the sampler counters of :class:`~fastlight.rollout.RolloutStats`:

======================  ==========================================  ==========================
key                     formula                                     FAST
======================  ==========================================  ==========================
raw_tps                 raw_steps / elapsed (dummy steps included)  raw sampling throughput
sample_efficiency       valid_steps / raw_steps                     sample efficiency
time_efficiency         step_time / wall_time                       time-efficiency ratio
effective_tps           valid_steps / elapsed                       effective throughput
per_sampler_tps         valid_steps / wall_time                     (one sampler's rate)
mean_episode_length     Σ episode lengths / episodes                §average episode length
resets_per_1k_valid     1000 · global_resets / valid_steps          (reset frequency)
truncated_episode_share cut episodes / episodes                     (short-time bias)
time_limit_share        time-limit endings / episodes               (the env's own truncation)
======================  ==========================================  ==========================

``effective_tps = raw_tps × sample_efficiency`` holds exactly. ``wall_time`` is the whole sampling
cycle (stepping + resets + inference + waiting) summed over samplers (*busy time*), so it only divides
per-sampler ratios; ``elapsed`` is the *wall clock* over which the counts were produced, the
denominator of ``raw_tps`` / ``effective_tps``. An episode cut by a DPSA/SGR unified truncation (or
``max_horizon``) counts at its cut length and in ``truncated_episode_share``; the env's own time limit
is ``time_limit_share``. Under DDP counters are summed and ``elapsed`` max-reduced (ranks sample over
the same period), so rates are whole-job figures. States are float64 (exact below 2**53).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics import Metric

from fastlight.rollout import RolloutStats

#: Summed counters (names of the metric states), in a fixed order.
SUM_STATES = (
    "raw_steps",
    "valid_steps",
    "step_time",
    "reset_time",
    "wall_time",
    "global_resets",
    "episodes",
    "episode_length_sum",
    "cut_episodes",
    "time_limit_episodes",
)

#: ``key: (numerator state, denominator state, scale)``: the metric is ``scale · num / den``.
RATIOS: dict[str, tuple[str, str, float]] = {
    "raw_tps": ("raw_steps", "elapsed", 1.0),
    "effective_tps": ("valid_steps", "elapsed", 1.0),
    "sample_efficiency": ("valid_steps", "raw_steps", 1.0),
    "time_efficiency": ("step_time", "wall_time", 1.0),
    "per_sampler_tps": ("valid_steps", "wall_time", 1.0),
    "mean_episode_length": ("episode_length_sum", "episodes", 1.0),
    "resets_per_1k_valid": ("global_resets", "valid_steps", 1000.0),
    "truncated_episode_share": ("cut_episodes", "episodes", 1.0),
    "time_limit_share": ("time_limit_episodes", "episodes", 1.0),
}
#: Keys returned by :meth:`ThroughputMetrics.compute`.
METRIC_KEYS = tuple(RATIOS)


def _ratio(num: Tensor, den: Tensor, scale: float = 1.0) -> Tensor:
    """``scale · num / den``; NaN when ``den == 0`` (undefined, e.g. no episode ended yet)."""
    if float(den) <= 0.0:
        return torch.tensor(math.nan, dtype=torch.float64, device=num.device)
    return scale * num / den


class ThroughputMetrics(Metric):
    """FAST's throughput family from sampler counters; see the module docstring for formulas.

    Example::

        metric = ThroughputMetrics()
        for rollout in rollouts:
            metric.update(rollout.stats)           # one sampler: elapsed = its wall_time
        metric.compute()["effective_tps"]
    """

    is_differentiable = False
    higher_is_better = None
    # ``elapsed`` is summed within a process but max-reduced across ranks, so the batch-local
    # fast path of ``forward`` (which reduces with dist_reduce_fx) would be wrong for it.
    full_state_update = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        for name in SUM_STATES:
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("elapsed", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="max")

    def update(self, stats: RolloutStats, elapsed: float | None = None) -> None:  # type: ignore[override]
        """Add one Rollout's counters, produced in ``elapsed`` wall-clock seconds (``None``:
        ``stats.wall_time``, right for one sampler, wrong for merged parallel ones)."""
        if not isinstance(stats, RolloutStats):
            raise TypeError(f"ThroughputMetrics.update expects RolloutStats, got {type(stats).__name__}")
        if elapsed is not None and elapsed < 0:
            raise ValueError(f"ThroughputMetrics.update: elapsed must be >= 0, got {elapsed}")
        for name in ("raw_steps", "valid_steps", "step_time", "reset_time", "wall_time", "global_resets"):
            getattr(self, name).add_(getattr(stats, name))
        self.episodes += len(stats.episodes)
        self.episode_length_sum += sum(ep.length for ep in stats.episodes)
        self.cut_episodes += sum(1 for ep in stats.episodes if ep.cut)
        self.time_limit_episodes += sum(1 for ep in stats.episodes if ep.truncated and not ep.cut)
        self.elapsed += stats.wall_time if elapsed is None else float(elapsed)

    def compute(self) -> dict[str, Tensor]:
        """The family as 0-d float64 tensors keyed by :data:`METRIC_KEYS` (NaN where undefined)."""
        states = self.metric_state
        return {key: _ratio(states[num], states[den], scale) for key, (num, den, scale) in RATIOS.items()}

    def totals(self) -> dict[str, float]:
        """The raw (local, unsynced) counters as floats, for reports and checkpoints."""
        return {name: float(value) for name, value in self.metric_state.items()}
