"""``termination_threshold: auto``: DPSA's threshold chosen from what a sampler measures.

DPSA (FAST §method) cuts a sampling cycle once a fraction ``termination_threshold`` of its E envs
has ended. A low threshold resets often and cuts the long episodes short (FAST's short-time bias);
a high one waits for the slowest env while the ended ones emit padding. The best one depends on the
cost of an env step, of the global reset, and on the distribution of episode lengths.

:class:`ThresholdChooser` measures the three and picks, for every cycle, the threshold ``k / E``
(``k`` = ended envs that trigger the cut, ``1 <= k <= E``) with the highest expected effective
throughput (valid transitions per second, FAST §Problem Definition) among those that cut at most
:data:`MAX_CUT_SHARE` of the episodes (of near-equal ones, the highest: fewer cuts for free).
The model of one cycle, for lengths ``L_1..L_E`` drawn from the measured distribution and
``H = max_horizon``:

- cut time ``T_k = min(k-th smallest L_i, H)``;
- valid steps ``V_k = sum_i min(L_i, T_k)`` (the ended envs' dummy steps are not valid);
- time ``R + T_k * c_round + V_k * c_step``: ``R`` the global reset, ``c_round`` the per-step
  overhead (policy inference, stacking, bootstrap), ``c_step`` one env's ``step()``;
- cut episodes ``#{i : L_i > T_k}`` beyond those the horizon cuts anyway (``L_i > H``).

Expectations are Monte Carlo over :data:`SIMULATED_CYCLES` cycles of i.i.d. lengths drawn from the
Kaplan-Meier estimate (lengths are right-censored) over a sliding window of recent episodes; mass
beyond the longest observed length is put past ``H``. Every :data:`EXPLORE_EVERY`-th cycle (and the
first, until :data:`MIN_EPISODES` episodes are known) runs at threshold 1.0, so the tail stays observed.
The cap on the cut share bounds the short-time bias that throughput alone would favour.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

#: The setting's value that asks for this chooser (``--data.termination_threshold auto``).
AUTO = "auto"
#: At most this share of episodes may be cut by the chosen threshold (see the module docstring).
MAX_CUT_SHARE = 0.2
#: Every n-th cycle runs at threshold 1.0 to keep observing long episodes.
EXPLORE_EVERY = 8
#: Episodes to observe (at threshold 1.0) before the first choice.
MIN_EPISODES = 16
#: Throughputs within this fraction of the best count as equal (about the Monte Carlo noise).
TIE = 0.01
#: Monte Carlo cycles per choice.
SIMULATED_CYCLES = 256


@dataclass
class CycleCosts:
    """What one sampling cycle cost, in seconds (a Collector's counters for that cycle)."""

    reset_s: float
    step_s: float
    other_s: float
    rounds: int
    env_steps: int


class ThresholdChooser:
    """Chooses the DPSA termination threshold of each cycle of one Collector.

    Args:
        num_envs: E, the Collector's envs.
        max_horizon: H, the cycle cap (``--data.max_horizon``).
        window: episodes (lengths with their censoring) kept for the length distribution; by
            default ``max(64, 8 * E)``.
        seed: the Monte Carlo draws' seed (a choice is deterministic given the observations).
    """

    def __init__(self, num_envs: int, max_horizon: int, *, window: int | None = None, seed: int = 0) -> None:
        if num_envs < 1 or max_horizon < 1:
            msg = f"ThresholdChooser needs num_envs, max_horizon >= 1, got {num_envs}, {max_horizon}"
            raise ValueError(msg)
        self.num_envs = num_envs
        self.max_horizon = max_horizon
        self.lengths: deque[tuple[int, bool]] = deque(maxlen=window or max(64, 8 * num_envs))
        self.costs: deque[CycleCosts] = deque(maxlen=16)
        self.cycles = 0
        self.rng = np.random.default_rng(seed)
        self.chosen = 1.0
        self.predicted: dict[str, float] = {}

    def threshold(self) -> float:
        """The threshold of the next cycle: 1.0 while exploring, else the current choice."""
        exploring = self._known() < MIN_EPISODES or not self.costs or self.cycles % EXPLORE_EVERY == 0
        return 1.0 if exploring else self.chosen

    def _known(self) -> int:
        return sum(1 for _, ended in self.lengths if ended)

    def observe(self, episodes: list[tuple[int, bool]], costs: CycleCosts) -> None:
        """Record one finished cycle: ``(length, ended)`` per env (``ended`` False when the cut or
        the horizon stopped it: a censored length), and what the cycle cost. Updates the choice."""
        self.cycles += 1
        self.lengths.extend(episodes)
        if costs.rounds > 0:
            self.costs.append(costs)
        if self._known() >= MIN_EPISODES and self.costs:
            self.chosen, self.predicted = self._choose()

    def _cost_model(self) -> tuple[float, float, float]:
        """(reset per cycle, overhead per round, one env step), averaged over recent cycles."""
        n = len(self.costs)
        reset = sum(c.reset_s for c in self.costs) / n
        rounds = sum(c.rounds for c in self.costs)
        steps = sum(c.env_steps for c in self.costs)
        step = sum(c.step_s for c in self.costs) / max(steps, 1)
        other = sum(c.other_s for c in self.costs) / max(rounds, 1)
        return reset, other, step

    def _draw(self, shape: tuple[int, int]) -> np.ndarray:
        """Episode lengths from the Kaplan-Meier estimate of the window (> H: runs past the horizon)."""
        times, mass = kaplan_meier(list(self.lengths), beyond=self.max_horizon + 1)
        return self.rng.choice(times, size=shape, p=mass)

    def _choose(self) -> tuple[float, dict[str, float]]:
        e, h = self.num_envs, self.max_horizon
        reset, other, step = self._cost_model()
        lengths = self._draw((SIMULATED_CYCLES, e))
        cut_times = np.minimum(np.sort(lengths, axis=1), h)  # [M, E]: T_k for k = 1..E
        clipped = np.minimum(lengths[:, :, None], cut_times[:, None, :])  # [M, E(env), E(k)]
        valid = clipped.sum(axis=1).mean(axis=0)  # [E(k)]
        time = reset + cut_times.mean(axis=0) * other + valid * step
        horizon_cut = (lengths > h).sum(axis=1, keepdims=True)
        cut = ((lengths[:, :, None] > cut_times[:, None, :]).sum(axis=1) - horizon_cut).mean(axis=0) / e
        tps = valid / np.maximum(time, 1e-12)
        ok = cut <= MAX_CUT_SHARE + 1e-9
        allowed = np.where(ok, tps, -np.inf)  # k = E (index E-1) is always allowed
        # Of the thresholds within TIE of the best throughput, the highest: as fast, fewer cuts.
        k = int(np.flatnonzero(allowed >= (1.0 - TIE) * allowed.max())[-1])
        return (k + 1) / e, {"effective_tps": float(tps[k]), "cut_share": float(cut[k])}


def kaplan_meier(samples: list[tuple[int, bool]], *, beyond: int) -> tuple[np.ndarray, np.ndarray]:
    """The Kaplan-Meier estimate of a length distribution from right-censored ``(length, ended)``
    ``samples``. Returns ``(times, mass)``: the distinct ended lengths (plus ``beyond`` when mass is
    left past the last observed end) and the probability of each, summing to 1."""
    if not samples:
        return np.array([beyond]), np.array([1.0])
    lengths = np.array([s[0] for s in samples])
    ended = np.array([s[1] for s in samples], dtype=bool)
    times = np.unique(lengths[ended])
    survival, mass = 1.0, []
    for t in times:
        at_risk = int((lengths >= t).sum())
        deaths = int(((lengths == t) & ended).sum())
        p = survival * deaths / at_risk
        mass.append(p)
        survival -= p
    if survival > 1e-12:
        times = np.append(times, beyond)
        mass.append(survival)
    out = np.clip(np.array(mass, dtype=float), 0.0, None)
    return times, out / out.sum()
