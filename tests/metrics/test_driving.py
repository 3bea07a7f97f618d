"""Driving metrics (FAST §5): the state extractor on hand-built highway-env scenes, the episode
tracker's events, the Metric's exact aggregation (the jackknife: tests/stats), and the recorder and
summary ``fastlight evaluate`` reports with (on a real checkpoint: tests/test_evaluate.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import gymnasium as gym
import highway_env  # noqa: F401 - registers the highway-env ids
import numpy as np
import pytest
import torch
from highway_env.vehicle.kinematics import Vehicle

from fastlight.metrics.driving import (
    METRICS,
    DrivingEpisode,
    DrivingMetrics,
    DrivingRecorder,
    DrivingState,
    DrivingThresholds,
    EpisodeTracker,
    driving_summary,
    is_highway_env,
    read_driving_state,
)
from fastlight.stats import ratio_of_sums_ci, stratified_mean_ci


# ---------------------------------------------------------------------------- the extractor
@pytest.fixture(scope="module")
def highway():
    env = gym.make("highway-fast-v0")
    env.reset(seed=0)
    yield env.unwrapped
    env.close()


def _scene(sim, ego_s: float, ego_speed: float, lane_id: int = 1, others=()):
    """Only the ego car on lane ``lane_id`` at ``ego_s``, plus ``others`` = (lane, s, speed) cars."""
    road, ego = sim.road, sim.vehicle
    lane = road.network.get_lane(("0", "1", lane_id))
    ego.position = lane.position(ego_s, 0.0)
    ego.heading, ego.speed, ego.crashed = lane.heading_at(ego_s), ego_speed, False
    ego.on_state_update()
    road.vehicles = [ego]
    for other_lane, s, speed in others:
        ol = road.network.get_lane(("0", "1", other_lane))
        road.vehicles.append(Vehicle(road, ol.position(s, 0.0), ol.heading_at(s), speed))
    return ego


def test_front_car_ttc_and_headway_match_the_formula(highway):
    # Ego at 25 m/s, a car 30 m ahead (centre to centre) at 20 m/s in the same lane: the
    # bumper-to-bumper gap is 30 - (5 + 5) / 2 = 25 m and TTC = 25 / (25 - 20) = 5 s.
    _scene(highway, 100.0, 25.0, others=[(1, 130.0, 20.0)])
    st = read_driving_state(highway)
    assert st.lane_index == ("0", "1", 1)
    torch.testing.assert_close(st.front_gap_m, 25.0, rtol=0, atol=1e-9)
    torch.testing.assert_close(st.front_closing_mps, 5.0, rtol=0, atol=1e-9)
    assert st.lateral_clearance_m is None  # nobody alongside
    tracker = EpisodeTracker(dt=1.0)
    tracker.reset(st)
    tracker.step(st)
    ep = tracker.finish()
    torch.testing.assert_close(ep.min_ttc_s, 5.0, rtol=0, atol=1e-9)
    torch.testing.assert_close(ep.min_headway_m, 25.0, rtol=0, atol=1e-9)


def test_an_opening_gap_or_a_car_in_another_lane_is_no_front_risk(highway):
    _scene(highway, 100.0, 20.0, others=[(1, 150.0, 28.0), (2, 110.0, 10.0)])
    st = read_driving_state(highway)
    torch.testing.assert_close(st.front_gap_m, 45.0, rtol=0, atol=1e-9)
    assert st.front_closing_mps == pytest.approx(-8.0)  # the front car pulls away
    tracker = EpisodeTracker(dt=1.0)
    tracker.reset(st)
    tracker.step(st)
    assert tracker.finish().min_ttc_s == DrivingThresholds().ttc_cap_s  # no closing: the cap


def test_side_clearance_counts_only_cars_alongside(highway):
    # A car in the next lane 1 m further along overlaps the ego car: the lanes are 4 m apart,
    # so the side gap is 4 - (2 + 2) / 2 = 2 m. A car two lanes over but 20 m ahead does not count.
    _scene(highway, 100.0, 25.0, others=[(2, 101.0, 25.0), (0, 120.0, 25.0)])
    st = read_driving_state(highway)
    torch.testing.assert_close(st.lateral_clearance_m, 2.0, rtol=0, atol=1e-9)
    assert st.front_gap_m is None


def test_speed_limit_speed_range_and_crash_are_read_from_the_scene(highway):
    ego = _scene(highway, 100.0, 31.0)
    ego.crashed = True
    st = read_driving_state(highway)
    assert st.speed_limit == 30.0 and st.speed > st.speed_limit  # highway-env's straight road: 30 m/s
    assert st.target_speed_range == tuple(highway.config["reward_speed_range"])
    assert st.crashed and st.on_road and st.goal_distance_m is None


def test_parking_precision_is_the_final_distance_to_the_goal_in_parking_v0():
    env = gym.make("parking-v0")
    env.reset(seed=3)
    sim = env.unwrapped
    tracker = EpisodeTracker(dt=1.0 / sim.config["policy_frequency"])
    tracker.reset(read_driving_state(sim))
    for _ in range(3):
        env.step(np.array([0.5, 0.2], dtype=np.float32))
        tracker.step(read_driving_state(sim))
    ep = tracker.finish()
    expected = float(np.linalg.norm(sim.vehicle.goal.position - sim.vehicle.position))
    assert ep.goal_episodes == 1.0 and expected > 0
    torch.testing.assert_close(ep.parking_error_m, expected, rtol=0, atol=1e-9)
    env.close()


def test_a_non_highway_env_is_refused():
    env = gym.make("CartPole-v1")
    with pytest.raises(TypeError, match="highway-env AbstractEnv, got CartPoleEnv"):
        read_driving_state(env.unwrapped)
    env.close()


# ---------------------------------------------------------------------------- the tracker
BASE = DrivingState(
    speed=25.0,
    forward_speed=25.0,
    lane_index=("0", "1", 1),
    on_road=True,
    crashed=False,
    speed_limit=30.0,
    front_gap_m=None,
    front_closing_mps=None,
    lateral_clearance_m=None,
    target_speed_range=(20.0, 30.0),
    goal_distance_m=None,
)


def test_tracker_counts_events_against_the_thresholds():
    tracker = EpisodeTracker(dt=0.5)  # accelerations are speed differences / 0.5 s
    tracker.reset(BASE)
    states = [
        replace(BASE, speed=23.0, forward_speed=23.0),  # -4 m/s²: a hard brake (<= -4)
        replace(BASE, speed=22.0, forward_speed=22.0),  # -2 m/s²: not hard
        replace(
            BASE, speed=23.6, forward_speed=23.6, lane_index=("0", "1", 2)
        ),  # +3.2: hard accel, a lane change
        replace(
            BASE, speed=31.0, forward_speed=31.0, lane_index=("1", "2", 0)
        ),  # next segment: no lane change
        replace(
            BASE, speed=1.0, forward_speed=1.0, on_road=False, lane_index=("1", "2", 0)
        ),  # stall, off-road
    ]
    for st in states:
        tracker.step(st)
    ep = tracker.finish()
    assert (ep.steps, ep.hard_brakes, ep.hard_accels, ep.lane_changes) == (5, 2, 2, 1)
    assert (ep.offroad_steps, ep.stall_steps, ep.speeding_steps, ep.limit_steps) == (1, 1, 1, 5)
    torch.testing.assert_close(ep.speed_sum, 100.6, rtol=0, atol=1e-9)
    # efficiency: (23 - 20) / 10, (22 - 20) / 10, 0.36, 1 (clipped), 0 (clipped)
    torch.testing.assert_close(ep.efficiency_sum, 0.3 + 0.2 + 0.36 + 1.0 + 0.0, rtol=0, atol=1e-9)
    assert ep.crashed == 0 and ep.min_ttc_s == 10.0 and ep.min_headway_m == 100.0


def test_tracker_rear_end_contact_is_ttc_zero_and_a_crash():
    tracker = EpisodeTracker(dt=1.0)
    tracker.reset(BASE)
    tracker.step(replace(BASE, front_gap_m=12.0, front_closing_mps=4.0))
    tracker.step(replace(BASE, front_gap_m=0.0, front_closing_mps=0.0, crashed=True))
    ep = tracker.finish()
    assert (ep.min_ttc_s, ep.min_headway_m, ep.crashed) == (0.0, 0.0, 1.0)


def test_tracker_refuses_misuse():
    with pytest.raises(ValueError, match="dt must be > 0"):
        EpisodeTracker(dt=0.0)
    with pytest.raises(RuntimeError, match="before reset"):
        EpisodeTracker(dt=1.0).step(BASE)
    with pytest.raises(ValueError, match="hard_brake_mps2 must be < 0 < hard_accel_mps2"):
        DrivingThresholds(hard_brake_mps2=1.0)


# ---------------------------------------------------------------------------- the Metric
def _random_episodes(rng: np.random.Generator, n: int) -> list[DrivingEpisode]:
    eps = []
    for _ in range(n):
        steps = float(rng.integers(5, 40))
        eps.append(
            DrivingEpisode(
                steps=steps,
                crashed=float(rng.random() < 0.3),
                min_ttc_s=float(rng.uniform(0, 10)),
                min_headway_m=float(rng.uniform(0, 100)),
                min_lateral_clearance_m=float(rng.uniform(0, 4)),
                hard_brakes=float(rng.integers(0, 5)),
                hard_accels=float(rng.integers(0, 5)),
                lane_changes=float(rng.integers(0, 8)),
                offroad_steps=float(rng.integers(0, 3)),
                speeding_steps=float(rng.integers(0, 3)),
                limit_steps=steps,
                stall_steps=float(rng.integers(0, 3)),
                speed_sum=steps * float(rng.uniform(15, 30)),
                efficiency_sum=steps * float(rng.uniform(0, 1)),
                efficiency_steps=steps,
            )
        )
    return eps


def test_merging_two_metric_states_equals_one_metric_over_all_episodes():
    eps = _random_episodes(np.random.default_rng(0), 12)
    whole, first, second = DrivingMetrics(), DrivingMetrics(), DrivingMetrics()
    for i, ep in enumerate(eps):
        whole.update(ep)
        (first if i < 5 else second).update(ep)
    first.merge_state(second)  # what DDP's sum reduction does across ranks
    merged, expected = first.compute(), whole.compute()
    assert set(merged) == set(METRICS)
    for key in METRICS:
        torch.testing.assert_close(merged[key], expected[key], rtol=1e-12, atol=0, equal_nan=True)
    # and the definitions: a pooled rate and an episode mean, by hand
    steps = sum(ep.steps for ep in eps)
    torch.testing.assert_close(
        float(expected["hard_brakes_per_100_steps"]), 100 * sum(ep.hard_brakes for ep in eps) / steps
    )
    torch.testing.assert_close(float(expected["min_ttc_s"]), float(np.mean([ep.min_ttc_s for ep in eps])))
    assert math.isnan(float(expected["parking_error_m"]))  # no parking goal: n/a in this scene


def test_metric_update_refuses_other_types():
    with pytest.raises(TypeError, match="expects a DrivingEpisode, got dict"):
        DrivingMetrics().update({"steps": 1})


# ---------------------------------------------------------------------------- what fastlight evaluate reports
def test_recorder_keeps_episodes_in_order_when_they_end_out_of_order(highway):
    recorder = DrivingRecorder()
    recorder.on_reset(highway, 0)
    recorder.on_reset(highway, 1)  # two envs in lockstep: episode 1 ends first, after 2 steps
    recorder.on_step(highway, 1, False)
    recorder.on_step(highway, 1, True)
    recorder.on_step(highway, 0, True)
    assert [ep.steps for ep in recorder.episodes] == [1.0, 2.0]
    with pytest.raises(RuntimeError, match="on_step of episode 2 before its on_reset"):
        recorder.on_step(highway, 2, True)
    for env_id, expected in (("merge-v0", True), ("CartPole-v1", False)):
        env = gym.make(env_id)  # wrapped (time limit, checks): the scene is env.unwrapped
        assert is_highway_env(env) is expected, env_id
        env.close()


def test_summary_is_the_metric_with_a_bootstrap_over_episodes():
    eps = _random_episodes(np.random.default_rng(5), 15)
    summary = driving_summary(eps, n_boot=2000, seed=4)
    metric = DrivingMetrics()
    for ep in eps:
        metric.update(ep)
    assert list(summary) == list(METRICS)
    for key, value in metric.compute().items():
        if math.isnan(float(value)):
            assert summary[key] is None, key  # parking_error_m: no goal in these episodes
            continue
        row = summary[key]
        assert row["value"] == pytest.approx(float(value), rel=1e-12), key
        assert row["ci_low"] <= row["value"] <= row["ci_high"] and row["ci_low"] < row["ci_high"], (key, row)
    # An episode mean's interval is the plain bootstrap of the mean over episodes; a per-step rate
    # resamples episodes whole (numerator and denominator together), scaled per 100 steps.
    crashed = np.array([ep.crashed for ep in eps])
    _, low, high = stratified_mean_ci({"all": crashed}, n_boot=2000, seed=4)
    assert (summary["collision_rate"]["ci_low"], summary["collision_rate"]["ci_high"]) == (low, high)
    brakes, steps = np.array([ep.hard_brakes for ep in eps]), np.array([ep.steps for ep in eps])
    _, low, high = ratio_of_sums_ci(brakes, steps, n_boot=2000, seed=4)
    row = summary["hard_brakes_per_100_steps"]
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((100 * low, 100 * high), rel=1e-12)
