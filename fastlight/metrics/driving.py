"""Closed-loop driving metrics (FAST §5) read from highway-env's own simulator state.

Each of FAST's closed-loop metrics here is a *ratio of sums over episodes*, so it reduces exactly
over DDP ranks (every state is summed) and resamples by episode:

==========================  =======================================  ===========  =============
key                         numerator / denominator                  unit         FAST metric
==========================  =======================================  ===========  =============
collision_rate              crashed episodes / episodes              share        collision
min_ttc_s                   Σ per-episode min TTC / episodes         s            front-car risk
min_headway_m               Σ per-episode min gap / episodes         m            safety margin
min_lateral_clearance_m     Σ per-episode min side gap / episodes    m            lateral avoidance
hard_brakes_per_100_steps   100 · steps with a ≤ HARD_BRAKE / steps  per 100      hard brake
hard_accels_per_100_steps   100 · steps with a ≥ HARD_ACCEL / steps  per 100      hard acceleration
lane_changes_per_100_steps  100 · lane changes / steps               per 100      lane keeping
offroad_share               steps off the road / steps               share        lane keeping
speeding_share              steps above the lane's limit / steps     share        speeding
efficiency                  Σ scaled forward speed / steps           [0, 1]       efficiency
mean_speed_mps              Σ speed / steps                          m/s          (efficiency)
stall_share                 steps below STALL_SPEED / steps          share        stall time
parking_error_m             Σ final distance to the goal / episodes  m            parking precision
                            with a goal (parking-v0 only)
==========================  =======================================  ===========  =============

A "step" is one env step (one policy decision); per-step quantities are read after the step.

- **TTC** to the leading vehicle in the ego lane: ``gap / (v_ego - v_front)`` while closing in, with
  ``gap = max(s_front - s_ego - (L_ego + L_front) / 2, 0)`` along the lane and speeds projected on it;
  a gap of 0 (rear-end contact) is TTC 0. Per-episode minima are capped (``ttc_cap_s``,
  ``headway_cap_m``, ``lateral_cap_m``; no closing front car counts as the cap) so the means exist.
- **Lateral clearance**: over vehicles overlapping the ego car along the lane,
  ``|r_other - r_ego| - (W_ego + W_other) / 2`` in the ego lane's frame.
- **Longitudinal acceleration** is ``(v_t - v_{t-1}) · policy_frequency`` (``v_0`` read after reset).
  highway-env sets both cars of a collision to the slower speed, so a crash step is usually a hard brake.
- **Thresholds** (:class:`DrivingThresholds`): hard brake ≤ -4 m/s², above the 3.4 m/s² AASHTO
  comfortable deceleration, top of the 2-4 m/s² harsh-braking range of naturalistic-driving studies
  (Naito et al. 2009; Jansen & Wesseling 2018, UDRIVE); hard acceleration ≥ +3 m/s² (≈ 0.3 g, the
  usual telematics trigger; ISO 15622 caps ACC at 2 m/s²); stall below 2 m/s.
- **Efficiency** maps ``v cos(heading)`` linearly from ``reward_speed_range`` to [0, 1], clipped
  (highway-env's high-speed reward).
- **Lane changes** count lane-id changes within one road segment.

FAST's red-light violation, yellow-light entry and pull-out deviation need scene elements no
highway-env scene has (:data:`NOT_IN_HIGHWAY_ENV`): "n/a", never estimated. Parking precision exists
only in ``parking-v0``; elsewhere it reads NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, astuple, dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric

if TYPE_CHECKING:
    import gymnasium as gym
    from highway_env.envs.common.abstract import AbstractEnv
    from highway_env.vehicle.kinematics import Vehicle

#: FAST §5 metrics that need scene elements no highway-env scene has, with the reason.
NOT_IN_HIGHWAY_ENV: dict[str, str] = {
    "red_light_violation": "no traffic lights in any highway-env scene (intersection-v0 is unsignalised)",
    "yellow_light_entry": "no traffic lights in any highway-env scene (intersection-v0 is unsignalised)",
    "pull_out_deviation": "no pull-out manoeuvre (start from a parked position into traffic) in highway-env",
}


@dataclass(frozen=True)
class DrivingThresholds:
    """Event thresholds and caps; the module docstring gives the source of each default."""

    hard_brake_mps2: float = -4.0
    hard_accel_mps2: float = 3.0
    stall_speed_mps: float = 2.0
    ttc_cap_s: float = 10.0
    headway_cap_m: float = 100.0
    lateral_cap_m: float = 4.0

    def __post_init__(self) -> None:
        brake, accel = self.hard_brake_mps2, self.hard_accel_mps2
        if not brake < 0 < accel:
            raise ValueError(f"hard_brake_mps2 must be < 0 < hard_accel_mps2, got {brake} and {accel}")
        for f, value in zip(fields(self), astuple(self), strict=True):
            if f.name not in ("hard_brake_mps2", "hard_accel_mps2") and value <= 0:
                raise ValueError(f"{f.name} must be > 0, got {value}")


@dataclass(frozen=True)
class DrivingState:
    """The ego vehicle's state after one env step (or after reset), as the metrics need it."""

    speed: float  # m/s
    forward_speed: float  # m/s, speed · cos(heading)
    lane_index: tuple  # highway-env LaneIndex (from node, to node, lane id)
    on_road: bool
    crashed: bool
    speed_limit: float | None  # m/s, the lane's limit
    front_gap_m: float | None  # bumper-to-bumper gap to the leading vehicle in the ego lane
    front_closing_mps: float | None  # v_ego - v_front along the lane (> 0: closing in)
    lateral_clearance_m: float | None  # min side gap to vehicles alongside, None if none
    target_speed_range: tuple[float, float] | None  # the env's reward_speed_range
    goal_distance_m: float | None  # distance to the parking goal, scenes with one


def _lane_speed(vehicle: Vehicle, lane_heading: float) -> float:
    return float(vehicle.speed * math.cos(vehicle.heading - lane_heading))


def read_driving_state(env: AbstractEnv) -> DrivingState:
    """The :class:`DrivingState` of ``env``'s first controlled vehicle (``env.unwrapped`` is fine too)."""
    from highway_env.envs.common.abstract import AbstractEnv
    from highway_env.envs.parking_env import ParkingEnv

    if not isinstance(env, AbstractEnv):
        raise TypeError(f"driving metrics need a highway-env AbstractEnv, got {type(env).__name__}")
    ego, road = env.vehicle, env.road
    lane = road.network.get_lane(ego.lane_index)
    s_ego, r_ego = lane.local_coordinates(ego.position)
    heading = lane.heading_at(s_ego)
    v_ego = _lane_speed(ego, heading)
    front, _ = road.neighbour_vehicles(ego, ego.lane_index)
    gap = closing = None
    if front is not None:
        s_front = lane.local_coordinates(front.position)[0]
        gap = max(float(s_front - s_ego) - (ego.LENGTH + front.LENGTH) / 2, 0.0)
        closing = v_ego - _lane_speed(front, lane.heading_at(s_front))
    side_gaps = []
    for other in road.vehicles:
        s, r = lane.local_coordinates(other.position)
        if other is not ego and abs(s - s_ego) < (ego.LENGTH + other.LENGTH) / 2:
            side_gaps.append(max(abs(float(r - r_ego)) - (ego.WIDTH + other.WIDTH) / 2, 0.0))
    speed_range = env.config.get("reward_speed_range")
    goal = ego.goal if isinstance(env, ParkingEnv) else None  # parking-v0's Landmark goal
    return DrivingState(
        speed=float(ego.speed),
        forward_speed=float(ego.speed * math.cos(ego.heading)),
        lane_index=tuple(ego.lane_index),
        on_road=bool(ego.on_road),
        crashed=bool(ego.crashed),
        speed_limit=None if lane.speed_limit is None else float(lane.speed_limit),
        front_gap_m=gap,
        front_closing_mps=closing,
        lateral_clearance_m=min(side_gaps, default=None),
        target_speed_range=None if speed_range is None else (float(speed_range[0]), float(speed_range[1])),
        goal_distance_m=None if goal is None else float(np.linalg.norm(goal.position - ego.position)),
    )


@dataclass
class DrivingEpisode:
    """Per-episode sums; :data:`METRICS` turns sums over episodes into the metrics."""

    episodes: float = 1.0
    steps: float = 0.0
    crashed: float = 0.0
    min_ttc_s: float = 0.0
    min_headway_m: float = 0.0
    min_lateral_clearance_m: float = 0.0
    hard_brakes: float = 0.0
    hard_accels: float = 0.0
    lane_changes: float = 0.0
    offroad_steps: float = 0.0
    speeding_steps: float = 0.0
    limit_steps: float = 0.0  # steps whose lane has a speed limit
    stall_steps: float = 0.0
    speed_sum: float = 0.0
    efficiency_sum: float = 0.0
    efficiency_steps: float = 0.0  # steps with a target speed range
    parking_error_m: float = 0.0
    goal_episodes: float = 0.0  # episodes with a parking goal


#: Field names of :class:`DrivingEpisode`, the metric states, in a fixed order.
SUM_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(DrivingEpisode))

#: ``key: (numerator field, denominator field, scale)``; the metric is ``scale · Σ num / Σ den``.
METRICS: dict[str, tuple[str, str, float]] = {
    "collision_rate": ("crashed", "episodes", 1.0),
    "min_ttc_s": ("min_ttc_s", "episodes", 1.0),
    "min_headway_m": ("min_headway_m", "episodes", 1.0),
    "min_lateral_clearance_m": ("min_lateral_clearance_m", "episodes", 1.0),
    "hard_brakes_per_100_steps": ("hard_brakes", "steps", 100.0),
    "hard_accels_per_100_steps": ("hard_accels", "steps", 100.0),
    "lane_changes_per_100_steps": ("lane_changes", "steps", 100.0),
    "offroad_share": ("offroad_steps", "steps", 1.0),
    "speeding_share": ("speeding_steps", "limit_steps", 1.0),
    "efficiency": ("efficiency_sum", "efficiency_steps", 1.0),
    "mean_speed_mps": ("speed_sum", "steps", 1.0),
    "stall_share": ("stall_steps", "steps", 1.0),
    "parking_error_m": ("parking_error_m", "goal_episodes", 1.0),
    "episode_steps": ("steps", "episodes", 1.0),
}


class EpisodeTracker:
    """Folds the :class:`DrivingState` after reset and after every step into one :class:`DrivingEpisode`.

    Args:
        dt: seconds between two states (``1 / env.config["policy_frequency"]``).
        thresholds: event thresholds and caps.
    """

    def __init__(self, dt: float, thresholds: DrivingThresholds | None = None) -> None:
        if not dt > 0:
            raise ValueError(f"dt must be > 0 seconds, got {dt}")
        self.dt = dt
        self.th = thresholds or DrivingThresholds()
        self._prev: DrivingState | None = None
        self._ep = DrivingEpisode()
        self._last: DrivingState | None = None

    def reset(self, state: DrivingState) -> None:
        """Start an episode from the state read after ``env.reset``."""
        th = self.th
        self._prev, self._last = state, None
        self._ep = DrivingEpisode(
            min_ttc_s=th.ttc_cap_s, min_headway_m=th.headway_cap_m, min_lateral_clearance_m=th.lateral_cap_m
        )

    def step(self, state: DrivingState) -> None:
        """Add the state read after one ``env.step``."""
        if self._prev is None:
            raise RuntimeError("EpisodeTracker.step before reset: call reset(state after env.reset) first")
        ep, th, prev = self._ep, self.th, self._prev
        ep.steps += 1
        accel = (state.speed - prev.speed) / self.dt
        ep.hard_brakes += accel <= th.hard_brake_mps2
        ep.hard_accels += accel >= th.hard_accel_mps2
        ep.lane_changes += state.lane_index[:2] == prev.lane_index[:2] and state.lane_index != prev.lane_index
        ep.offroad_steps += not state.on_road
        if state.speed_limit is not None:
            ep.limit_steps += 1
            ep.speeding_steps += state.speed > state.speed_limit
        ep.stall_steps += state.speed < th.stall_speed_mps
        ep.speed_sum += state.speed
        if state.target_speed_range is not None:
            lo, hi = state.target_speed_range
            ep.efficiency_sum += min(max((state.forward_speed - lo) / (hi - lo), 0.0), 1.0)
            ep.efficiency_steps += 1
        if state.front_gap_m is not None:
            ep.min_headway_m = min(ep.min_headway_m, state.front_gap_m)
            if state.front_gap_m == 0.0:  # bumpers touch: a collision is happening, TTC is 0
                ep.min_ttc_s = 0.0
            elif state.front_closing_mps is not None and state.front_closing_mps > 0:
                ep.min_ttc_s = min(ep.min_ttc_s, state.front_gap_m / state.front_closing_mps)
        if state.lateral_clearance_m is not None:
            ep.min_lateral_clearance_m = min(ep.min_lateral_clearance_m, state.lateral_clearance_m)
        ep.crashed = max(ep.crashed, float(state.crashed))
        self._prev = self._last = state

    def finish(self) -> DrivingEpisode:
        """The finished episode's sums (the parking error is read from the last state)."""
        if self._last is None:
            raise RuntimeError("EpisodeTracker.finish before any step: an episode has at least one step")
        ep = self._ep
        if self._last.goal_distance_m is not None:
            ep.parking_error_m, ep.goal_episodes = self._last.goal_distance_m, 1.0
        self._prev = self._last = None
        return ep


def ratio_of_sums(num: Tensor | float, den: Tensor | float, scale: float = 1.0) -> float:
    """``scale · num / den``; NaN when ``den == 0`` (the metric does not exist in this scene)."""
    return math.nan if float(den) <= 0 else scale * float(num) / float(den)


class DrivingMetrics(Metric):
    """FAST §5 driving metrics over evaluation episodes; see the module docstring for definitions.

    Example::

        metric = DrivingMetrics()
        tracker = EpisodeTracker(dt=1 / env.unwrapped.config["policy_frequency"])
        tracker.reset(read_driving_state(env.unwrapped))
        ...  # after every env.step: tracker.step(read_driving_state(env.unwrapped))
        metric.update(tracker.finish())
        metric.compute()["min_ttc_s"]
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    sums: Tensor

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("sums", torch.zeros(len(SUM_FIELDS), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, episode: DrivingEpisode) -> None:  # type: ignore[override]
        """Add one finished episode."""
        if not isinstance(episode, DrivingEpisode):
            raise TypeError(f"DrivingMetrics.update expects a DrivingEpisode, got {type(episode).__name__}")
        self.sums += torch.tensor(astuple(episode), dtype=torch.float64, device=self.sums.device)

    def totals(self) -> dict[str, float]:
        """The summed :class:`DrivingEpisode` fields (local, unsynced), for reports."""
        return dict(zip(SUM_FIELDS, self.sums.tolist(), strict=True))

    def compute(self) -> dict[str, Tensor]:
        """The metrics as 0-d float64 tensors keyed like :data:`METRICS` (NaN: not in this scene)."""
        sums = dict(zip(SUM_FIELDS, self.sums, strict=True))
        return {
            key: torch.tensor(ratio_of_sums(sums[num], sums[den], scale), dtype=torch.float64)
            for key, (num, den, scale) in METRICS.items()
        }


def is_highway_env(env: gym.Env) -> bool:
    """Whether ``env`` (wrapped or not) is a highway-env scene, the simulator the metrics read."""
    from highway_env.envs.common.abstract import AbstractEnv

    return isinstance(env.unwrapped, AbstractEnv)


class DrivingRecorder:
    """An :class:`~fastlight.evaluation.EpisodeObserver` keeping one :class:`DrivingEpisode` per episode:
    ``episodes``, in episode order."""

    def __init__(self, thresholds: DrivingThresholds | None = None) -> None:
        self.thresholds = thresholds or DrivingThresholds()
        self._trackers: dict[int, EpisodeTracker] = {}
        self._done: dict[int, DrivingEpisode] = {}

    @property
    def episodes(self) -> list[DrivingEpisode]:
        return [self._done[i] for i in sorted(self._done)]

    def on_reset(self, env: gym.Env, episode: int) -> None:
        sim = env.unwrapped
        self._trackers[episode] = EpisodeTracker(1.0 / sim.config["policy_frequency"], self.thresholds)
        self._trackers[episode].reset(read_driving_state(sim))

    def on_step(self, env: gym.Env, episode: int, done: bool) -> None:
        if episode not in self._trackers:
            raise RuntimeError(f"DrivingRecorder.on_step of episode {episode} before its on_reset")
        self._trackers[episode].step(read_driving_state(env.unwrapped))
        if done:
            self._done[episode] = self._trackers.pop(episode).finish()


def driving_summary(
    episodes: Sequence[DrivingEpisode], *, n_boot: int = 10_000, seed: int = 0
) -> dict[str, dict[str, float] | None]:
    """Every :data:`METRICS` value over ``episodes`` (what :class:`DrivingMetrics` computes) with its 95%
    percentile-bootstrap interval, resampling episodes (:func:`fastlight.stats.ratio_of_sums_ci`);
    ``None`` for a metric not in this scene."""
    from fastlight.stats import ratio_of_sums_ci

    rows = [asdict(e) for e in episodes]
    out: dict[str, dict[str, float] | None] = {}
    for key, (num, den, scale) in METRICS.items():
        column = [[r[num] for r in rows], [r[den] for r in rows]]
        value, low, high = (scale * x for x in ratio_of_sums_ci(*column, n_boot=n_boot, seed=seed))
        out[key] = None if math.isnan(value) else {"value": value, "ci_low": low, "ci_high": high}
    return out
