"""``python -m benchmarks.sampling.model``: a model of fastlight's sampling cycle, validated against the
measured cells of ``benchmarks/results`` and used to predict clip and core counts no machine here has.

FAST (§Problem Definition) splits *effective throughput* (valid on-policy transitions per second) into
raw sampling throughput x sample efficiency (valid / raw steps), with the time-efficiency ratio (env
stepping time / sampling-cycle time) saying how much resets drag the cycle. This model predicts the four
from what a sampler measures, for the reset modes as :class:`~fastlight.sampling.collector.Collector`
implements them (FAST §DPSA; SGR and autoreset are its baselines, sequential the baseline of FAST's
§execution-time table):

- **One sampler's cycle** is the cost model of :mod:`fastlight.sampling.auto_threshold`
  (``reset + T x c_round + V x c_step``): a global reset, then ``T`` rows (policy steps) of which the
  ``V`` valid env steps cost one ``env.step`` each. ``T`` is the unified truncation: the ``k``-th
  end among the clips, ``k = ceil(threshold x E)`` (``sgr``: the first), capped at ``max_horizon``;
  the ended clips emit dummy steps that cost no ``env.step``.
- **Resets** (:mod:`fastlight.sampling.resets`): the resets of one moment run on the sampler's thread
  pool when one costs ``POOL_RESET_S`` or more, so their I/O-bound scenario loads overlap and their
  CPU parts queue on the GIL: ``load + n x cpu``; a single reset (an autoreset env ending alone)
  runs inline. FAST's shared simulator (``shared_sim``) reloads clips one after another: ``n x
  (load + cpu)``, and one tick steps every clip.
- **Samplers and cores**: the clips are split over ``workers`` processes as ``sampler_plan`` does
  (one per core by default; ``sequential`` is one env in one process); each steps its clips one
  after another. Strictly on-policy, a round ends when the trainer has every sampler's item and
  publishes new weights (``round_s`` later); a ``dpsa``/``sgr`` sampler resets ahead while it waits
  (:meth:`~fastlight.sampling.resets.EnvResets.reset_ahead`). ``rank_rounds="together"`` (fastlight's
  default for ``dpsa``/``sgr``) cuts every sampler of the rank when the termination rate over all
  clips passes the threshold (FAST §DPSA); ``apart`` cuts each on its own clips. More samplers than
  cores share them: CPU work is stretched until the demand fits the cores (processor sharing);
  scenario loads and ``step_wait_s`` take no core.

Expectations are Monte Carlo over i.i.d. episode lengths (seeded, deterministic). What the model
ignores is listed in ``benchmarks/results/sampling.md`` (section "A model of the sampling cycle").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from fastlight.sampling.auto_threshold import CycleCosts, kaplan_meier
from fastlight.sampling.resets import POOL_RESET_S

MODES = ("dpsa", "sgr", "autoreset", "sequential")
#: Episodes simulated per prediction (at least; the Monte Carlo noise is then ~1 %).
EPISODES = 40_000
#: Rounds simulated before the counters start (the first has no reset done ahead).
WARMUP_ROUNDS = 2


@dataclass(frozen=True)
class Lengths:
    """A discrete distribution of natural episode lengths (env steps): ``values`` with ``probs``."""

    values: tuple[int, ...]
    probs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.values) != len(self.probs) or not self.values or min(self.values) < 1:
            raise ValueError(f"Lengths needs matching non-empty values >= 1, got {self.values}, {self.probs}")

    @property
    def mean(self) -> float:
        return float(np.dot(self.values, self.probs))

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        p = np.asarray(self.probs, dtype=float)
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=shape, p=p / p.sum())


def erlang_lengths(*, mean: float, cap: int, shape: int = 2, limit_share: float | None = None) -> Lengths:
    """``min(ceil(X), cap)`` for ``X ~ Gamma(shape, theta)``, ``theta`` set so that the mean is ``mean``
    (``cap``: the env's time limit, where the rest of the mass ends). ``limit_share``: the measured share
    of episodes that reach the time limit, put at ``cap`` (the rest keeps the Gamma's shape below it)."""

    def make(theta: float) -> Lengths:
        x = np.arange(cap + 1) / theta
        cdf = 1.0 - np.exp(-x) * sum(x**n / math.factorial(n) for n in range(shape))
        p = np.diff(cdf)
        p[-1] += 1.0 - cdf[-1]
        if limit_share is not None:
            p[:-1] *= (1.0 - limit_share) / p[:-1].sum()
            p[-1] = limit_share
        return Lengths(tuple(range(1, cap + 1)), tuple(float(q) for q in p))

    lo, hi = 1e-3, 10.0 * cap
    for _ in range(60):  # the mean grows with theta
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if make(mid).mean < mean else (lo, mid)
    return make(0.5 * (lo + hi))


def fixed_lengths(*, length: int) -> Lengths:
    return Lengths((length,), (1.0,))


def observed_lengths(samples: Sequence[tuple[int, bool]], *, beyond: int) -> Lengths:
    """The Kaplan-Meier estimate :class:`~fastlight.sampling.auto_threshold.ThresholdChooser` uses:
    ``(length, ended)`` samples, censored ones (``ended`` False) as lower bounds."""
    times, mass = kaplan_meier(list(samples), beyond=beyond)
    return Lengths(tuple(int(t) for t in times), tuple(float(m) for m in mass))


@dataclass(frozen=True)
class Costs:
    """What the sampling cycle costs, in seconds (measured on one free core).

    Args:
        step_s: CPU time of one ``env.step``.
        step_wait_s: the part of a step that takes no core (a GPU simulator, a sleep).
        load_s: the I/O-bound part of one env reset (a scenario load): overlaps on the reset pool.
        reset_cpu_s: the CPU part of one env reset: serial within a sampler (the GIL).
        row_s: per policy step of a sampler (act, stacking, bootstrap).
        row_env_s: per env stepped in that row (checks, bookkeeping).
        round_s: the trainer's side of a round (transfer, update, publish), samplers waiting.
        shared_sim: FAST's one shared simulator: a tick (``step_s + step_wait_s``) steps every clip,
            and reloads queue one after another.
    """

    step_s: float
    step_wait_s: float = 0.0
    load_s: float = 0.0
    reset_cpu_s: float = 0.0
    row_s: float = 6e-4
    row_env_s: float = 4e-5
    round_s: float = 3.4e-3
    shared_sim: bool = False

    @classmethod
    def from_cycles(cls, cycles: Sequence[CycleCosts], *, num_envs: int, load_s: float = 0.0) -> Costs:
        """From a Collector's per-cycle counters (what ``ThresholdChooser`` records), with the same
        split: ``step = step_s / env_steps``, ``row = other_s / rounds``, a global reset of
        ``num_envs`` envs = ``load_s + num_envs x reset_cpu_s``."""
        steps = sum(c.env_steps for c in cycles)
        rounds = sum(c.rounds for c in cycles)
        reset = sum(c.reset_s for c in cycles) / max(len(cycles), 1)
        return cls(
            step_s=sum(c.step_s for c in cycles) / max(steps, 1),
            load_s=load_s,
            reset_cpu_s=max(reset - load_s, 0.0) / num_envs,
            row_s=sum(c.other_s for c in cycles) / max(rounds, 1),
            row_env_s=0.0,
        )

    def stretched(self, factor: float) -> Costs:
        """The CPU parts ``factor`` times slower (cores shared by more samplers than cores)."""
        return replace(
            self, step_s=self.step_s * factor, reset_cpu_s=self.reset_cpu_s * factor,
            row_s=self.row_s * factor, row_env_s=self.row_env_s * factor,
        )  # fmt: skip


def resets_s(costs: Costs, n: np.ndarray | int) -> np.ndarray:
    """Seconds for ``n`` env resets started at one moment in one sampler (see the module docstring)."""
    n = np.asarray(n)
    one = costs.load_s + costs.reset_cpu_s
    if costs.shared_sim:
        return n * one
    pooled = costs.load_s + n * costs.reset_cpu_s
    return np.where(n > 1, pooled if one >= POOL_RESET_S else n * one, n * one)


@dataclass(frozen=True)
class Prediction:
    """FAST's throughput family (as :class:`~fastlight.metrics.throughput.ThroughputMetrics` defines it)
    and what explains it. ``round_cv``: per figure, the spread of one round's value (coefficient of
    variation of the ratio's residual), so a measurement over ``n`` rounds has a relative standard
    error of about ``round_cv / sqrt(n)``."""

    mode: str
    clips: int
    workers: int
    raw_tps: float
    effective_tps: float
    sample_efficiency: float
    time_efficiency: float
    busy: float
    mean_episode_length: float
    cut_share: float
    resets_per_1k_valid: float
    cpu_stretch: float
    round_cv: dict[str, float]


@dataclass
class _Rounds:
    """Per measured round, summed over the samplers (seconds, steps, episodes)."""

    valid: np.ndarray
    raw: np.ndarray
    step: np.ndarray
    busy: np.ndarray
    cpu: np.ndarray
    elapsed: np.ndarray
    episodes: np.ndarray
    cut: np.ndarray
    length_sum: np.ndarray
    resets: np.ndarray


def split_clips(*, clips: int, workers: int) -> np.ndarray:
    """Envs per sampler, as ``fastlight.data.sampler_plan`` splits them."""
    base, extra = divmod(clips, workers)
    return np.array([base + (w < extra) for w in range(workers)], dtype=np.int64)


def predict(
    *,
    mode: str,
    clips: int,
    costs: Costs,
    lengths: Lengths,
    cores: int,
    threshold: float = 0.5,
    workers: int | None = None,
    max_horizon: int = 200,
    rollout_steps: int = 32,
    cycles_per_round: int = 1,
    rank_rounds: str = "together",
    path: str = "procs",
    seed: int = 0,
) -> Prediction:
    """Predicts one cell: ``mode`` with ``clips`` clips on ``cores`` cores.

    ``workers``: sampler processes (default one per core, at most one per clip); ``sequential`` is one
    env in one process, and ``path="single"`` one Collector in this process with no trainer (the
    benchmark's ``--path single``: rates over the sampler's own wall time). ``rollout_steps``: rows per
    autoreset round; ``cycles_per_round``: dpsa/sgr cycles per sampler per round.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if clips < 1 or cores < 1 or not 0.0 <= threshold <= 1.0 or rank_rounds not in ("together", "apart"):
        raise ValueError(f"bad cell: clips {clips}, cores {cores}, threshold {threshold}, {rank_rounds}")
    if mode == "sequential":
        clips = 1
    w = 1 if path == "single" or mode == "sequential" else min(workers or cores, clips)
    if costs.shared_sim and (w > 1 or mode == "autoreset"):
        raise ValueError("shared_sim: one simulator process, global resets only (sequential: one clip)")
    envs = split_clips(clips=clips, workers=w)
    cell = dict(
        mode=mode, envs=envs, lengths=lengths, threshold=threshold, horizon=max_horizon,
        rollout_steps=rollout_steps, cycles=cycles_per_round, together=rank_rounds == "together" and w > 1,
        barrier=path != "single", seed=seed,
    )  # fmt: skip
    stretch, r = 1.0, _simulate(costs=costs, **cell)
    if r.cpu.sum() / r.elapsed.sum() > cores * (1 + 1e-6):  # more CPU demand than cores: share them
        lo, hi = 1.0, float(w)
        for _ in range(24):  # the stretch at which the samplers' CPU work just fills the cores
            stretch = 0.5 * (lo + hi)
            r = _simulate(costs=costs.stretched(stretch), **cell)
            lo, hi = (stretch, hi) if r.cpu.sum() / stretch / r.elapsed.sum() > cores else (lo, stretch)
    cv = {
        "effective_tps": _ratio_cv(r.valid, r.elapsed), "raw_tps": _ratio_cv(r.raw, r.elapsed),
        "sample_efficiency": _ratio_cv(r.valid, r.raw), "time_efficiency": _ratio_cv(r.step, r.busy),
    }  # fmt: skip
    return Prediction(
        mode=mode, clips=clips, workers=w, raw_tps=_div(r.raw, r.elapsed),
        effective_tps=_div(r.valid, r.elapsed), sample_efficiency=_div(r.valid, r.raw),
        time_efficiency=_div(r.step, r.busy),
        busy=_div(r.busy, w * r.elapsed), mean_episode_length=_div(r.length_sum, r.episodes),
        cut_share=_div(r.cut, r.episodes), resets_per_1k_valid=1000.0 * _div(r.resets, r.valid),
        cpu_stretch=stretch, round_cv=cv,
    )  # fmt: skip


def _div(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.sum() / b.sum())


def _ratio_cv(a: np.ndarray, b: np.ndarray) -> float:
    """Spread of one round's ``a / b``: the residual ``a - (sum a / sum b) b`` over the mean of ``a``."""
    z = a - a.sum() / b.sum() * b
    return float(z.std(ddof=1) / a.mean()) if len(a) > 1 and a.mean() > 0 else math.nan


def _simulate(*, mode: str, costs: Costs, envs: np.ndarray, lengths: Lengths, **kw: object) -> _Rounds:
    rng = np.random.default_rng(kw.pop("seed"))
    if mode in ("dpsa", "sgr"):
        return _simulate_cycles(mode=mode, costs=costs, envs=envs, lengths=lengths, rng=rng, **kw)
    return _simulate_autoreset(costs=costs, envs=envs, lengths=lengths, rng=rng, **kw)


def _rows(costs: Costs, active: np.ndarray) -> np.ndarray:
    """Seconds of each row (policy step) with ``active`` clips stepped in it."""
    if costs.shared_sim:
        return costs.row_s + active * costs.row_env_s + (active > 0) * (costs.step_s + costs.step_wait_s)
    return costs.row_s + active * (costs.row_env_s + costs.step_s + costs.step_wait_s)


def _simulate_cycles(
    *, mode: str, costs: Costs, envs: np.ndarray, lengths: Lengths, rng: np.random.Generator,
    threshold: float, horizon: int, cycles: int, together: bool, barrier: bool, **_: object,
) -> _Rounds:  # fmt: skip
    """dpsa/sgr: ``cycles`` cycles per sampler per round, rounds closed by the on-policy barrier."""
    w, e_max, clips = len(envs), int(envs.max()), int(envs.sum())
    h = min(horizon, max(lengths.values))  # rows past the longest episode never happen
    rounds = WARMUP_ROUNDS + max(100, math.ceil(EPISODES / clips / cycles))
    n = rounds * cycles
    mask = np.arange(e_max)[None, :] < envs[:, None]  # [W, E]
    lc = np.where(mask, np.minimum(lengths.draw(rng, (n, w, e_max)), horizon + 1), 0)  # [N, W, E]
    bins = np.arange(n * w)[:, None] * (h + 2) + np.minimum(lc, h + 1).reshape(n * w, e_max)
    hist = np.bincount(bins[np.broadcast_to(mask, lc.shape).reshape(n * w, e_max)], minlength=n * w * (h + 2))
    ended = np.cumsum(hist.reshape(n, w, h + 2)[:, :, 1 : h + 1], axis=2)  # clips ended by row t = 1..h
    active = envs[None, :, None] - np.concatenate([np.zeros((n, w, 1), np.int64), ended[:, :, :-1]], axis=2)
    cum = np.cumsum(_rows(costs, active), axis=2)  # seconds after row t
    last = np.minimum(lc.max(axis=2), h)  # every clip ended, or the horizon
    if mode == "sgr":
        k_own, k_rank = np.ones(w, dtype=np.int64), 1
    else:
        k_own, k_rank = (
            np.ceil((threshold - 1e-9) * envs).astype(np.int64),
            math.ceil((threshold - 1e-9) * clips),
        )
    srt = np.sort(np.where(mask, lc, horizon + 2), axis=2)
    kth = np.take_along_axis(srt, np.maximum(k_own - 1, 0)[None, :, None], axis=2)[..., 0]
    t_cut = np.where(k_own == 0, 1, np.minimum(kth, last))  # [N, W] rows of each cycle (apart)
    reset = resets_s(costs, envs).astype(float)  # [W] one global reset each
    elapsed = np.zeros(rounds)
    publish, ready, end = 0.0, None, np.zeros(w)
    for r in range(rounds if barrier or together else 0):
        for c in range(cycles):
            i = r * cycles + c
            if c == 0 and barrier:  # strictly on-policy: the round starts with the new weights
                start = np.maximum(publish, ready) if ready is not None else publish + reset
            else:
                start = end + reset
            if together:
                t_cut[i] = _rank_cut(cum[i], start, lc[i], mask, last[i], k_rank, h)
            end = start + cum[i, np.arange(w), t_cut[i] - 1]
        if barrier:
            ready = end + reset  # the next cycle's global reset, done ahead while waiting
            elapsed[r] = float(end.max()) + costs.round_s - publish
            publish = float(end.max()) + costs.round_s
    return _cycle_rounds(costs, envs, lc, mask, t_cut, active, cum, reset, elapsed, rounds, barrier)


def _rank_cut(
    cum: np.ndarray, start: np.ndarray, lc: np.ndarray, mask: np.ndarray, last: np.ndarray, k: int, h: int
) -> np.ndarray:
    """Rows each sampler steps when the rank cuts at the ``k``-th end over all its clips, in wall time
    (each finishes the step under way; one whose clips all ended has stopped)."""
    w = len(start)
    if k == 0:
        return np.ones(w, dtype=np.int64)
    ends_in = mask & (lc <= h)
    if k > int(ends_in.sum()):
        return last
    ends = np.where(ends_in, start[:, None] + cum[np.arange(w)[:, None], np.clip(lc, 1, h) - 1], np.inf)
    tau = np.partition(ends.ravel(), k - 1)[k - 1]
    reached = (start[:, None] + cum) >= tau - 1e-12
    first = np.where(reached.any(axis=1), reached.argmax(axis=1) + 1, h)
    return np.minimum(first, last)


def _cycle_rounds(
    costs: Costs, envs: np.ndarray, lc: np.ndarray, mask: np.ndarray, t_cut: np.ndarray, active: np.ndarray,
    cum: np.ndarray, reset: np.ndarray, elapsed: np.ndarray, rounds: int, barrier: bool,
) -> _Rounds:  # fmt: skip
    """Per-round counters of the simulated cycles, warm-up rounds left out."""
    n, w = t_cut.shape
    ii, ww, t0 = np.arange(n)[:, None], np.arange(w)[None, :], t_cut - 1
    valid = np.cumsum(active, axis=2)[ii, ww, t0]  # [N, W]
    busy = cum[ii, ww, t0] + reset
    steps = t_cut if costs.shared_sim else valid  # the env steps (shared: ticks) that cost a step
    cpu = steps * costs.step_s + t_cut * costs.row_s + valid * costs.row_env_s + envs * costs.reset_cpu_s

    def per_round(x: np.ndarray) -> np.ndarray:
        return np.broadcast_to(x, (n, w)).sum(axis=1).reshape(rounds, -1).sum(axis=1)[WARMUP_ROUNDS:]

    busy_r = per_round(busy)
    return _Rounds(
        valid=per_round(valid), raw=per_round(envs * t_cut),
        step=per_round(steps * (costs.step_s + costs.step_wait_s)),
        busy=busy_r, cpu=per_round(cpu), elapsed=elapsed[WARMUP_ROUNDS:] if barrier else busy_r,
        episodes=per_round(envs), cut=per_round((mask & (lc > t_cut[..., None])).sum(axis=2)),
        length_sum=per_round(valid), resets=per_round(np.ones(w)),
    )  # fmt: skip


def _simulate_autoreset(
    *, costs: Costs, envs: np.ndarray, lengths: Lengths, rng: np.random.Generator, rollout_steps: int,
    barrier: bool, **_: object,
) -> _Rounds:  # fmt: skip
    """autoreset/sequential: ``rollout_steps`` rows per round, each env resetting when it ends."""
    w, e_max, clips = len(envs), int(envs.max()), int(envs.sum())
    rounds = WARMUP_ROUNDS + max(50, math.ceil(EPISODES * lengths.mean / clips / rollout_steps))
    rows = rounds * rollout_steps
    mask = np.arange(e_max)[None, :] < envs[:, None]
    draws = int(rows / lengths.mean * 1.3) + 30
    ends = np.cumsum(lengths.draw(rng, (w, e_max, draws)), axis=2)
    while ends[..., -1][mask].min() < rows:  # rare: more episodes than drawn
        more = np.cumsum(lengths.draw(rng, (w, e_max, draws)), axis=2) + ends[..., -1:]
        ends = np.concatenate([ends, more], axis=2)
    sel = mask[..., None] & (ends <= rows)
    flat = (np.broadcast_to(np.arange(w)[:, None, None], ends.shape) * rows + ends - 1)[sel]
    n_end = np.bincount(flat, minlength=w * rows).reshape(w, rounds, rollout_steps)  # envs ending per row
    keep = slice(WARMUP_ROUNDS, None)
    busy = (rollout_steps * _rows(costs, envs.astype(float))[:, None] + resets_s(costs, n_end).sum(axis=2))[
        :, keep
    ]
    k = rounds - WARMUP_ROUNDS
    valid = np.full(k, float(rollout_steps * clips))
    per_step = costs.step_s + costs.step_wait_s
    ticks = float(rollout_steps) if costs.shared_sim else valid  # shared_sim: one clip, one tick a row
    cpu = (0.0 if costs.shared_sim else valid * costs.step_s) + rollout_steps * w * costs.row_s
    cpu = cpu + valid * costs.row_env_s + n_end[:, keep].sum(axis=(0, 2)) * costs.reset_cpu_s
    return _Rounds(
        valid=valid, raw=valid, step=np.full(k, 1.0) * ticks * per_step, busy=busy.sum(axis=0), cpu=cpu,
        elapsed=busy.max(axis=0) + costs.round_s if barrier else busy.sum(axis=0),
        episodes=np.ones(k), cut=np.zeros(k), length_sum=np.full(k, lengths.mean),  # natural episodes
        resets=np.zeros(k),
    )  # fmt: skip


def main() -> None:
    from benchmarks.sampling.model_report import main as report_main

    report_main()


if __name__ == "__main__":
    main()
