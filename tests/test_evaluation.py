"""The one evaluation path: the success rule, the episode player, the per-task summary.

The readings of success fastlight had before :func:`fastlight.rollout.success_after` are kept
here as small reference functions, so the cases where they disagreed are visible next to the one
verdict that replaced them.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from fastlight import evaluation
from fastlight.evaluation import (
    EpisodeSpec,
    one_at_a_time,
    per_task_outcomes,
    per_task_summary,
    play_episodes,
    seeded_specs,
    task_specs,
)
from fastlight.modules.rollout_logging import rollout_metrics
from fastlight.rollout import EpisodeRecord, crashed_at_end, success_after
from fastlight.sampling.collector import Collector
from fastlight.stats import wilson_interval
from tests.fake_envs import FixedLengthEnv


def verdict(infos: list[dict]) -> bool | None:
    v = None
    for info in infos:
        v = success_after(v, info)
    return v


# The readings this rule replaced: an episode's step infos -> success.
def old_end_either_key(infos):  # the training collector: "success", else "is_success", last step
    return bool(infos[-1].get("success", infos[-1].get("is_success", False)))


def old_end_success_only(infos):  # run_episodes: info["success"] of the last step
    return bool(infos[-1].get("success", False))


def old_any_step_either_key(infos):  # fastlight evaluate: either key, any step
    return any(bool(i.get(k, False)) for i in infos for k in ("is_success", "success"))


def old_any_step_success_only(infos):  # play_tasks (the VLA evaluation): info["success"], any step
    return any(bool(i.get("success", False)) for i in infos)


OLD_READINGS = (old_end_either_key, old_end_success_only, old_any_step_either_key, old_any_step_success_only)


@pytest.mark.parametrize(
    ("infos", "expected"),
    [
        # Meta-World with terminate_on_success off: success at step 2, not at the last step.
        ([{"success": False}, {"success": True}, {"success": False}], True),
        # gymnasium-robotics reports is_success, which two of the old readings ignored.
        ([{"is_success": False}, {"is_success": True}], True),
        # Meta-World's raw info: a float 0.0 / 1.0, and a last step that does not repeat it.
        ([{"success": np.float64(1.0)}, {}], True),
        # Both keys on one step: either one true is a success (the collector read "success" first).
        ([{"success": False, "is_success": True}], True),
    ],
)
def test_success_at_any_step_under_either_key_where_the_old_readings_disagreed(infos, expected):
    assert {read(infos) for read in OLD_READINGS} == {True, False}  # the old readings disagreed here
    assert verdict(infos) is expected


@pytest.mark.parametrize(
    ("infos", "expected"),
    [
        ([{"success": False}, {"success": False}], False),  # reported, never reached
        ([{"success": 0.0}, {"success": 1.0}], True),  # reached at the end: every reading agrees
        ([{"is_success": np.bool_(False)}], False),
        ([{"crashed": False, "speed": 25.0}, {"crashed": True}], None),  # highway-env: no success key
        ([], None),  # no step at all
    ],
)
def test_success_verdicts_reported_or_not(infos, expected):
    assert verdict(infos) is expected


def test_a_step_without_the_key_keeps_the_verdict():
    assert success_after(True, {}) is True and success_after(False, {"speed": 1.0}) is False
    assert success_after(None, {"is_success": 0}) is False  # reported: a plain bool, not None


def test_crash_is_the_last_steps_report():
    assert crashed_at_end({"crashed": np.bool_(True)}) is True
    assert crashed_at_end({"crashed": 0}) is False
    assert crashed_at_end({"success": True}) is None


# ---------------------------------------------------------------------- test envs
class MidwaySuccessEnv(FixedLengthEnv):
    """4-step episodes that report ``key`` true on step 2 only (``key=None``: no success report);
    ``render()`` is a 2x2 frame filled with the step index; the obs carries the reset seed."""

    def __init__(self, key: str | None = "success", length: int = 4) -> None:
        super().__init__(lengths=(length,))
        self.key = key
        self.seed_seen: int | None = None

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        self.seed_seen = seed
        return obs, info

    def step(self, action):
        obs, reward, term, trunc, _ = super().step(action)
        info = {} if self.key is None else {self.key: self.t == 2}
        return obs, float(action) + reward, term, trunc, info

    def render(self):
        return np.full((2, 2, 3), self.t, np.uint8)


class SeededTaskEnv(gym.Env):
    """A two-task env: the reset seed and ``options["task_id"]`` fix the episode's length (1-5 steps);
    task 1 succeeds at its last step. obs = ``{"x": [task, seed % 97, t]}``."""

    task_names = ("fails", "succeeds")

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)})
        self.action_space = gym.spaces.Discrete(3)

    def _obs(self):
        return {"x": np.array([self.task, self.seed % 97, self.t], np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed, self.task, self.t = seed, options["task_id"], 0
        self.length = int(np.random.default_rng([seed, self.task]).integers(1, 6))
        return self._obs(), {"task_id": self.task}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        return self._obs(), float(action), end and self.task == 1, end and self.task == 0, {
            "success": end and self.task == 1
        }


def obs_rule(obs, step):
    """A deterministic batched policy: action = (task + seed + step) mod 3, row by row."""
    return (obs["x"][:, 0] + obs["x"][:, 1] + step).astype(np.int64) % 3


# ---------------------------------------------------------------------- the player
def test_player_records_seeds_success_frames_and_the_crash_rule():
    env = MidwaySuccessEnv()
    seen = []
    act = one_at_a_time(lambda obs, step: seen.append((obs[1], step)) or 1)
    recs = play_episodes(act, [env], seeded_specs(3, 7, record=True))
    assert [r.seed for r in recs] == [7, 8, 9] and env.seed_seen == 9
    # Success was reported on step 2 only; the episode went on and still counts as a success.
    assert all(r.success is True and r.length == 4 and r.terminated and not r.truncated for r in recs)
    assert all(r.ret == 8.0 and r.crashed is None and r.task is None and r.task_id == 0 for r in recs)
    # One call per step, one observation at a time, with the step index inside the episode.
    assert seen == [(float(t), t) for t in range(4)] * 3
    # The reset frame and one per step.
    assert [int(f[0, 0, 0]) for f in recs[0].frames] == [0, 1, 2, 3, 4]
    quiet = play_episodes(one_at_a_time(lambda obs, step: 0), [MidwaySuccessEnv(None)], seeded_specs(1, 0))
    assert quiet[0].success is None and quiet[0].frames == []


def test_lockstep_never_mixes_tasks_and_matches_one_env_at_a_time():
    specs = task_specs(SeededTaskEnv.task_names, 4, seed=3)
    assert [s.task for s in specs] == ["fails"] * 4 + ["succeeds"] * 4
    assert [s.seed for s in specs] == [evaluation.eval_seed(3, k, i) for k in range(2) for i in range(4)]
    sizes = []

    def counted(obs, step):
        sizes.append(len(step))
        assert len(set(obs["x"][:, 0].tolist())) == 1  # one task per batched call
        return obs_rule(obs, step)

    batched = play_episodes(counted, [SeededTaskEnv() for _ in range(3)], specs)
    single = play_episodes(obs_rule, [SeededTaskEnv()], specs)
    assert batched == single  # lockstep changes nothing but the batching
    assert sizes[0] == 3 and max(sizes) == 3 and 1 in sizes  # groups of 3 then 1 per task (4 = 3 + 1)
    assert [r.success for r in single] == [False] * 4 + [True] * 4
    assert [r.truncated for r in single] == [True] * 4 + [False] * 4
    assert [r.task_id for r in single] == [0] * 4 + [1] * 4
    lengths = [int(np.random.default_rng([s.seed, s.task_id]).integers(1, 6)) for s in specs]
    assert [r.length for r in single] == lengths


def test_an_env_without_a_time_limit_is_cut_at_max_episode_steps(monkeypatch):
    monkeypatch.setattr(evaluation, "MAX_EPISODE_STEPS", 6)
    env = FixedLengthEnv(lengths=(10**6,))  # no spec, so no time limit of its own
    (rec,) = play_episodes(one_at_a_time(lambda obs, step: 0), [env], [EpisodeSpec(seed=1)])
    assert (rec.length, rec.terminated, rec.truncated) == (6, False, True)
    with pytest.raises(ValueError, match="at least one env"):
        play_episodes(one_at_a_time(lambda obs, step: 0), [], [EpisodeSpec(seed=1)])


def test_run_episodes_replays_the_same_random_episodes():
    a = evaluation.run_episodes("CartPole-v1", None, episodes=3, seed=11)
    b = evaluation.run_episodes("CartPole-v1", None, episodes=3, seed=11)
    assert [(e.seed, e.length, e.ret) for e in a] == [(e.seed, e.length, e.ret) for e in b]
    assert [e.seed for e in a] == [11, 12, 13] and all(e.ret == float(e.length) for e in a)
    assert all(e.success is None and e.crashed is None for e in a)  # CartPole reports neither


# ---------------------------------------------------------------------- the training side
@pytest.mark.parametrize(("key", "success"), [("success", True), ("is_success", True), (None, None)])
def test_the_collector_uses_the_same_rule(key, success, obs_value_policy):
    r = Collector([MidwaySuccessEnv(key)], mode="dpsa", termination_threshold=1.0).collect(obs_value_policy)
    (ep,) = r.stats.episodes
    assert ep.success is success and ep.length == 4 and not ep.cut
    # rollout/success_rate counts it; an env that reports no success counts 0, as before.
    assert float(rollout_metrics(r, current_version=0)["rollout/success_rate"]) == float(bool(success))


# ---------------------------------------------------------------------- summaries
def test_per_task_summary_numbers():
    def rec(task, ok, length):
        return EpisodeRecord(length, float(bool(ok)), bool(ok), not ok, success=ok, task=task)

    eps = [rec("a", True, 2), rec("a", False, 4), rec("b", True, 1), rec("b", True, 1), rec("c", None, 2)]
    names = ("a", "b", "c")
    assert {t: v.tolist() for t, v in per_task_outcomes(eps, names).items()} == {
        "a": [1.0, 0.0],
        "b": [1.0, 1.0],
        "c": [0.0],  # not reported counts as no success
    }
    s = per_task_summary(eps, names, n_boot=2000, seed=0)
    assert s["per_task"]["a"] == {
        "successes": 1,
        "episodes": 2,
        "rate": 0.5,
        "ci_low": wilson_interval(1, 2)[0],
        "ci_high": wilson_interval(1, 2)[1],
    }
    assert s["per_task"]["b"]["rate"] == 1.0 and s["per_task"]["b"]["ci_high"] == 1.0
    assert s["mean"]["rate"] == pytest.approx(0.5) and s["mean"]["ci_low"] <= 0.5 <= s["mean"]["ci_high"]
    assert s["mean_length"] == pytest.approx(2.0) and s["mean_return"] == pytest.approx(3 / 5)


def test_an_empty_action_chunk_is_refused_instead_of_looping_forever():
    def act(obs, step):
        return np.zeros((len(step), 0), dtype=np.int64)  # [B, H=0]: no action for any episode

    with pytest.raises(ValueError, match="act returned an empty action chunk for episode 0"):
        evaluation.play_episodes(act, [FixedLengthEnv(lengths=(3,))], seeded_specs(1, 0), action_chunk=4)
