"""``termination_threshold: auto``: the Kaplan-Meier lengths, the choice against an exact model, and
a Collector that keeps long episodes whole where a fixed 0.5 cuts them."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fastlight.sampling.auto_threshold import (
    EXPLORE_EVERY,
    MAX_CUT_SHARE,
    CycleCosts,
    ThresholdChooser,
    kaplan_meier,
)
from fastlight.sampling.collector import Collector
from fastlight.sampling.collector_settings import COLLECTOR_RANGES, check_ranges
from tests.fake_envs import FixedLengthEnv


def test_kaplan_meier_uncensored_is_the_empirical_distribution():
    samples = [(3, True), (3, True), (7, True), (200, True)]
    times, mass = kaplan_meier(samples, beyond=201)
    assert times.tolist() == [3, 7, 200]
    np.testing.assert_allclose(mass, [0.5, 0.25, 0.25], rtol=0, atol=1e-12)


def test_kaplan_meier_with_censoring_by_hand():
    # t=3: 4 at risk, 1 ends -> 0.25; the 5 is censored; t=7: 2 at risk -> 0.75 * 1/2; t=10: the rest.
    times, mass = kaplan_meier([(3, True), (5, False), (7, True), (10, True)], beyond=99)
    assert times.tolist() == [3, 7, 10]
    np.testing.assert_allclose(mass, [0.25, 0.375, 0.375], rtol=0, atol=1e-12)
    # Mass past the last end (a censored tail) goes to `beyond`: the episode runs to the cap.
    times, mass = kaplan_meier([(3, True), (9, False), (9, False)], beyond=99)
    assert times.tolist() == [3, 99]
    np.testing.assert_allclose(mass, [1 / 3, 2 / 3], rtol=0, atol=1e-12)


def exact_model(lengths: list[int], probs: list[float], e: int, h: int, costs: tuple[float, float, float]):
    """Expected valid steps, time and cut share for k = 1..E by enumerating every joint draw
    (the naive loop the chooser's Monte Carlo estimates)."""
    reset, other, step = costs
    valid = np.zeros(e)
    time = np.zeros(e)
    cut = np.zeros(e)
    for draw in itertools.product(range(len(lengths)), repeat=e):
        p = math.prod(probs[j] for j in draw)
        ls = sorted(lengths[j] for j in draw)
        for k in range(1, e + 1):
            t = min(ls[k - 1], h)
            v = sum(min(x, t) for x in ls)
            valid[k - 1] += p * v
            time[k - 1] += p * (reset + t * other + v * step)
            cut[k - 1] += p * (sum(x > t for x in ls) - sum(x > h for x in ls)) / e
    return valid / time, cut


def fed(
    lengths: list[int], e: int, h: int, costs: tuple[float, float, float], cycles: int
) -> ThresholdChooser:
    """A chooser that has seen ``cycles`` cycles whose envs ran ``lengths`` (cycled) with these costs."""
    chooser = ThresholdChooser(e, h, window=len(lengths) * 16, seed=1)
    reset, other, step = costs
    it = itertools.cycle(lengths)
    for _ in range(cycles):
        eps = [(min(next(it), h), True) for _ in range(e)]
        n = sum(x for x, _ in eps)
        chooser.observe(eps, CycleCosts(reset, n * step, h * other, rounds=h, env_steps=n))
    return chooser


@pytest.mark.parametrize(
    "lengths, probs, costs",
    [
        ([20, 20, 20, 200], [0.75, 0.25], (0.0, 1e-3, 1e-5)),  # cheap reset: cut the straggler
        ([20, 20, 20, 200], [0.75, 0.25], (5.0, 1e-3, 1e-5)),  # slow reset: wait for it
        ([3, 200], [0.5, 0.5], (0.0, 1e-3, 1e-5)),  # a low threshold would cut half: capped
        ([10, 30, 60], [1 / 3] * 3, (0.05, 2e-4, 1e-4)),
    ],
)
def test_choice_matches_the_exact_model(lengths, probs, costs):
    e, h = 4, 250
    distinct = sorted(set(lengths))
    exact_probs = [lengths.count(x) / len(lengths) for x in distinct]
    tps, cut = exact_model(distinct, exact_probs, e, h, costs)
    chooser = fed(lengths, e, h, costs, cycles=40)
    k = round(chooser.chosen * e)
    feasible = [i for i in range(e) if cut[i] <= MAX_CUT_SHARE]
    best = max(feasible, key=lambda i: tps[i])
    # Monte Carlo (256 cycles) against the exact expectation: within 3 % of the best allowed
    # throughput, and within the cap up to sampling error.
    assert tps[k - 1] >= 0.97 * tps[best], (k, best + 1, tps)
    assert cut[k - 1] <= MAX_CUT_SHARE + 0.05


def test_costs_move_the_choice():
    # 8 envs, one 200-step straggler in eight: cutting at step 20 cuts 1/8 of the episodes (allowed).
    lengths = [20] * 7 + [200]
    cheap = fed(lengths, 8, 250, (0.0, 1e-3, 1e-5), cycles=40).chosen
    slow = fed(lengths, 8, 250, (5.0, 1e-3, 1e-5), cycles=40).chosen
    assert cheap < 0.9 and slow == 1.0  # cut the straggler only while resets are cheap


def test_explores_at_one_until_it_knows_then_every_nth_cycle():
    chooser = ThresholdChooser(8, 50)
    assert chooser.threshold() == 1.0  # nothing known yet
    seen = []
    for _ in range(3 * EXPLORE_EVERY):
        seen.append(chooser.threshold())
        chooser.observe([(5, True)] * 7 + [(40, True)], CycleCosts(0.0, 0.01, 0.04, rounds=40, env_steps=75))
    assert seen[:2] == [1.0, 1.0]  # 16 episodes (two cycles) before the first choice
    late = seen[EXPLORE_EVERY:]
    assert [i for i, x in enumerate(late) if x == 1.0] == [0, EXPLORE_EVERY]  # one cycle in eight explores
    # Otherwise cut the 40-step env once most 5-step ones ended: any k whose cut comes at step 5
    # almost always is as fast; ties go to the highest such k (iid draws put 2+ long envs in a
    # cycle often enough to make k = 7 slower).
    chosen = set(late) - {1.0}
    assert len(chosen) <= 2 and all(0.5 <= x < 1.0 for x in chosen), chosen


def uneven_envs(e: int) -> list[FixedLengthEnv]:
    # Half the envs run 3 steps, half 200, every cycle (the phases alternate per env).
    return [FixedLengthEnv(lengths=(3, 200) if i % 2 else (200, 3), tag=i) for i in range(e)]


def run(threshold, cycles: int, policy) -> tuple[float, list[float]]:
    c = Collector(uneven_envs(8), mode="dpsa", termination_threshold=threshold, max_horizon=250)
    episodes = cut = 0
    used = []
    for _ in range(cycles):
        r = c.collect(policy)
        used.append(r.stats.threshold_sum / r.stats.global_resets)
        episodes += len(r.stats.episodes)
        cut += sum(ep.cut for ep in r.stats.episodes)
    c.close()
    return cut / episodes, used


def test_collector_auto_keeps_long_episodes_that_half_cuts(obs_value_policy):
    fixed_share, fixed_used = run(0.5, 6, obs_value_policy)
    assert fixed_share == 0.5 and set(fixed_used) == {0.5}  # every long episode cut at step 3
    auto_share, used = run("auto", 12, obs_value_policy)
    # After the exploring cycles, auto cuts only when more than half ended: no long episode is cut.
    assert auto_share == 0.0
    assert min(used) > 0.5 and max(used) == 1.0


def test_auto_is_a_valid_setting_and_others_are_refused():
    settings = {"reset_mode": "dpsa", "num_envs": 4, "termination_threshold": "auto", "max_horizon": 9,
                "rollout_steps": 1, "nonfinite": "raise"}  # fmt: skip
    check_ranges(settings, COLLECTOR_RANGES)
    with pytest.raises(
        ValueError, match=r"--data.termination_threshold must be in \[0, 1\] or auto, got 'aut'"
    ):
        check_ranges(settings | {"termination_threshold": "aut"}, COLLECTOR_RANGES)
