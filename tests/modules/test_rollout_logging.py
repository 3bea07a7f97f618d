"""``rollout/*`` units: returns of completed episodes only (SB3's ``ep_rew_mean``), cut ones apart."""

from __future__ import annotations

import pytest

from fastlight.modules.rollout_logging import rollout_metrics
from fastlight.sampling.collector import Collector
from tests.fake_envs import FixedLengthEnv
from tests.policies import ObsValuePolicy


def dpsa_rollout():
    """4 envs of lengths 2, 3, 9, 9 (reward 1 per step), DPSA threshold 0.5: at t=3 half have
    terminated, so the two 9-step episodes are cut at 3 steps (return 3, no outcome)."""
    envs = [FixedLengthEnv(lengths=(n,), tag=i) for i, n in enumerate((2, 3, 9, 9))]
    rollout = Collector(envs, mode="dpsa", termination_threshold=0.5, max_horizon=8).collect(ObsValuePolicy())
    ended = sorted((e.length, e.cut) for e in rollout.stats.episodes)
    assert ended == [(2, False), (3, False), (3, True), (3, True)]
    return rollout


def test_return_averages_completed_episodes_only():
    m = {k: float(v) for k, v in rollout_metrics(dpsa_rollout(), current_version=0).items()}
    # Completed: returns 2 and 3 -> 2.5 (the old mean over all four, cut ones at their cut length, was 2.75).
    assert m["rollout/return"] == pytest.approx(2.5)
    assert m["rollout/episode_length"] == pytest.approx(2.5)
    assert m["rollout/episodes"] == 2
    # The cut ones are reported apart: two, each with return 3 at the cut.
    assert m["rollout/episodes_cut"] == 2
    assert m["rollout/return_cut"] == pytest.approx(3.0)


def test_a_rollout_with_only_cut_episodes_logs_no_return():
    rollout = dpsa_rollout()
    rollout.stats.episodes = [e for e in rollout.stats.episodes if e.cut]
    m = rollout_metrics(rollout, current_version=0)
    assert "rollout/return" not in m and "rollout/success_rate" not in m
    assert float(m["rollout/episodes"]) == 0 and float(m["rollout/episodes_cut"]) == 2
