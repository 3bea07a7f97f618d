"""``SamplingAdvice``: one warning per wasteful setting, naming it, once, and only once judged."""

from __future__ import annotations

import warnings

import pytest

from fastlight.data.advice import MIN_ROLLOUTS, SamplingAdvice
from fastlight.rollout import EpisodeRecord, RolloutStats


def stats(lengths_cut: list[tuple[int, bool]], *, reset: float = 0.0, step: float = 1.0) -> RolloutStats:
    eps = [EpisodeRecord(length=n, ret=0.0, terminated=not c, truncated=c, cut=c) for n, c in lengths_cut]
    return RolloutStats(episodes=eps, reset_time=reset, step_time=step, wall_time=reset + step + 0.1)


def feed(advice: SamplingAdvice, s: RolloutStats, n: int) -> list[list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = [advice.update(s) for _ in range(n)]
    assert [str(w.message) for w in caught] == [line for lines in out for line in lines]  # warned = returned
    return out


def half_cut() -> RolloutStats:
    # 8 envs: 4 ended at step 3, 4 cut there (the 3/200-step case at threshold 0.5).
    return stats([(3, False)] * 4 + [(3, True)] * 4)


def test_cut_episodes_warn_once_naming_the_threshold():
    advice = SamplingAdvice(reset_mode="dpsa", termination_threshold=0.5, max_horizon=200, num_envs=8)
    out = feed(advice, half_cut(), 3 * MIN_ROLLOUTS)
    assert out[: MIN_ROLLOUTS - 1] == [[]] * (MIN_ROLLOUTS - 1)  # not judged before MIN_ROLLOUTS
    (line,) = out[MIN_ROLLOUTS - 1]
    assert line.startswith("fastlight: 50% of episodes were cut short")
    assert "--data.termination_threshold 0.5" in line and "set it to auto" in line
    assert all(o == [] for o in out[MIN_ROLLOUTS:])  # once


def test_horizon_cuts_name_max_horizon_not_the_threshold():
    advice = SamplingAdvice(reset_mode="dpsa", termination_threshold=1.0, max_horizon=30, num_envs=4)
    out = feed(advice, stats([(30, True)] * 3 + [(12, False)]), MIN_ROLLOUTS)
    (line,) = out[-1]
    assert "75% of episodes ran past --data.max_horizon 30" in line


def test_reset_bound_sampling_warns_with_time_efficiency():
    advice = SamplingAdvice(reset_mode="dpsa", termination_threshold=1.0, max_horizon=200, num_envs=2)
    out = feed(advice, stats([(3, False)] * 2, reset=0.9, step=0.05), MIN_ROLLOUTS)
    (line,) = out[-1]
    assert "spent 86% of their time in env.reset (perf/time_efficiency 0.05)" in line
    assert "raise --data.termination_threshold" in line


@pytest.mark.parametrize("mode", ["autoreset", "sequential"])
def test_autoreset_modes_get_no_advice(mode):
    advice = SamplingAdvice(reset_mode=mode, termination_threshold=0.5, max_horizon=200, num_envs=8)
    assert feed(advice, half_cut(), 2 * MIN_ROLLOUTS) == [[]] * (2 * MIN_ROLLOUTS)


def test_a_healthy_run_gets_no_advice():
    advice = SamplingAdvice(reset_mode="dpsa", termination_threshold=0.75, max_horizon=200, num_envs=8)
    healthy = stats([(30, False)] * 7 + [(30, True)], reset=0.01, step=1.0)  # 1 in 8 cut: under 0.3
    assert feed(advice, healthy, 2 * MIN_ROLLOUTS) == [[]] * (2 * MIN_ROLLOUTS)


def test_the_envs_own_time_limit_is_not_a_cut():
    """Episodes ended by the env's time limit (truncated, not cut) are no reason to raise the threshold:
    no DPSA setting changes them (perf/time_limit_share counts them, not perf/truncated_episode_share)."""
    advice = SamplingAdvice(reset_mode="dpsa", termination_threshold=0.5, max_horizon=200, num_envs=8)
    time_limit = [EpisodeRecord(length=50, ret=0.0, terminated=False, truncated=True) for _ in range(8)]
    s = RolloutStats(episodes=time_limit, step_time=1.0, wall_time=1.1)
    assert feed(advice, s, 2 * MIN_ROLLOUTS) == [[]] * (2 * MIN_ROLLOUTS)
