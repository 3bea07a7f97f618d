"""Advice, once, when the sampling settings waste a run of uneven episodes (FAST §DPSA).

Two ways DPSA's settings go wrong: **cut episodes** (a unified truncation cuts the long episodes as
soon as the short ones end: ``perf/truncated_episode_share``) and **reset-bound sampling** (slow resets
and short cycles: ``perf/time_efficiency`` near 0). :class:`SamplingAdvice` warns once for each.
"""

from __future__ import annotations

from lightning.pytorch.utilities import rank_zero_warn

from fastlight.rollout import RolloutStats
from fastlight.sampling.collector_settings import RESET_MODES

#: Rollouts to sum before judging (the first cycles of a run include start-up).
MIN_ROLLOUTS = 4
#: A share of cut episodes above this is worth a warning (auto's cap: ``auto_threshold.MAX_CUT_SHARE``).
CUT_SHARE_WARN = 0.3
#: A share of sampler time spent in ``env.reset`` above this is worth a warning.
RESET_SHARE_WARN = 0.5


class SamplingAdvice:
    """Warns once per case when cut episodes or resets dominate, after :data:`MIN_ROLLOUTS` Rollouts and
    two episodes per env; the arguments are the rank's ``--data`` settings of the same names."""

    def __init__(
        self, *, reset_mode: str, termination_threshold: float | str, max_horizon: int, num_envs: int
    ) -> None:
        self.reset_mode = reset_mode
        self.traits = RESET_MODES[reset_mode]
        self.threshold = termination_threshold
        self.max_horizon = max_horizon
        self.num_envs = num_envs
        self.rollouts = 0
        self.episodes = self.cut_by_threshold = self.cut_by_horizon = 0
        self.reset_time = self.wall_time = self.step_time = 0.0
        self.warned: set[str] = set()

    def update(self, stats: RolloutStats) -> list[str]:
        """Add one Rollout's counters; returns (and warns) the advice lines first due now."""
        if not self.traits.cycles:
            return []  # without cycles nothing is cut and envs reset one at a time
        self.rollouts += 1
        self.episodes += len(stats.episodes)
        at_horizon = [e.length >= self.max_horizon for e in stats.episodes if e.cut]
        self.cut_by_horizon += sum(at_horizon)
        self.cut_by_threshold += len(at_horizon) - sum(at_horizon)
        self.reset_time += stats.reset_time
        self.wall_time += stats.wall_time
        self.step_time += stats.step_time
        if self.rollouts < MIN_ROLLOUTS or self.episodes < 2 * self.num_envs:
            return []
        due = [(key, line) for key, line in self._advice() if key not in self.warned]
        for key, line in due:
            self.warned.add(key)
            rank_zero_warn(line)
        return [line for _, line in due]

    def _advice(self) -> list[tuple[str, str]]:
        out = []
        mode, thr, cuts = self.reset_mode, self.threshold, self.traits.threshold
        cut = self.cut_by_threshold / self.episodes
        if cut > CUT_SHARE_WARN:
            if not cuts:
                todo = f"--data.reset_mode dpsa ({mode.upper()} cuts every env at the first end)"
            elif thr == "auto":
                todo = "--data.max_horizon or more envs per sampler (auto could not keep the cut share lower)"
            else:
                todo = "raise --data.termination_threshold (e.g. 0.9) or set it to auto"
            setting = f"--data.reset_mode {mode}" + (f", --data.termination_threshold {thr}" if cuts else "")
            out.append(("cut", f"fastlight: {cut:.0%} of episodes were cut short by the unified truncation "
                        f"(perf/truncated_episode_share; {setting}): the long episodes stop when the short "
                        f"ones end, and their returns are bootstrapped; {todo}"))  # fmt: skip
        horizon = self.cut_by_horizon / self.episodes
        if horizon > CUT_SHARE_WARN:
            out.append(("horizon", f"fastlight: {horizon:.0%} of episodes ran past --data.max_horizon "
                        f"{self.max_horizon} and were cut there; raise --data.max_horizon to the episodes' "
                        "length"))  # fmt: skip
        reset = self.reset_time / self.wall_time if self.wall_time > 0 else 0.0
        if reset > RESET_SHARE_WARN:
            if not cuts:
                todo = "--data.reset_mode dpsa with a high --data.termination_threshold (or auto)"
            elif thr != "auto":
                todo = "raise --data.termination_threshold (or set it to auto): longer cycles per reset"
            else:
                todo = "more envs per sampler (their resets overlap) or a cheaper env.reset"
            out.append(("reset", f"fastlight: the samplers spent {reset:.0%} of their time in env.reset "
                        f"(perf/time_efficiency {self.step_time / self.wall_time:.2f}): every {mode} cycle "
                        f"starts with a reset of all envs; {todo}"))  # fmt: skip
        return out
