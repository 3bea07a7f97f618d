"""The convergence benchmark: time to target against a naive loop, the valid-step budget on a real
DataModule with a sampler process, the SB3 peer (act_fn adapter, wall-clock snapshots, the "reaches
SB3's final return sooner" line), bad input, and tiny end-to-end runs (``benchmark``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from benchmarks.convergence.__main__ import SB3_LABEL, main, parse_args, summarise, target_lines
from benchmarks.convergence.race import race_to_peer_final, time_to_target
from benchmarks.sampling.procs import FixedPolicy, SpaceRandomPolicy
from fastlight.data.datamodule import RolloutDataModule
from fastlight.fleet.faults import FaultSettings


def _naive_ttt(times: list[float], returns: list[float], target: float) -> float:
    for t, r in zip(times, returns, strict=True):
        if r >= target:
            return t
    return math.inf


def test_time_to_target_matches_a_naive_loop() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        times = np.cumsum(rng.uniform(0.5, 2.0, n)).tolist()
        returns = rng.normal(0, 1, n).tolist()
        target = float(rng.normal(0.5, 1))
        assert time_to_target(times, returns, target) == _naive_ttt(times, returns, target)
    assert time_to_target([0.0, 10.0, 20.0], [1.0, 5.0, 9.0], 5.0) == 10.0  # reaching = at least
    with pytest.raises(ValueError, match="increasing"):
        time_to_target([2.0, 1.0], [0.0, 0.0], 0.0)


def test_valid_step_budget_shares_and_errors() -> None:
    dm = RolloutDataModule(
        env_id="tests.fake_envs:FixedLength-v0", num_envs=3, num_workers=2, valid_steps_per_step=25
    )
    assert [c.min_valid_steps for c in dm.sampler_configs(0)] == [17, 9]  # ceil(25 * 2/3), ceil(25 / 3)
    assert dm.max_valid_per_rollout() >= 25
    assert [
        c.min_valid_steps
        for c in RolloutDataModule(
            env_id="tests.fake_envs:FixedLength-v0", num_envs=2, num_workers=1
        ).sampler_configs(0)
    ] == [0]
    with pytest.raises(ValueError, match="--data.valid_steps_per_step must be null or >= 1"):
        RolloutDataModule(env_id="tests.fake_envs:FixedLength-v0", valid_steps_per_step=0)


@pytest.mark.slow  # a spawned sampler: seconds on a quiet machine, tens of seconds on a loaded one
@pytest.mark.multiproc
def test_every_rollout_holds_the_valid_step_budget() -> None:
    """A real sampler process over 2 envs of 5-step episodes (DPSA@1: 10 valid per cycle): a budget
    of 25 takes exactly 3 whole cycles per Rollout, every time."""
    dm = RolloutDataModule(
        env_id="tests.fake_envs:FixedLength-v0",
        num_envs=2,
        num_workers=1,
        reset_mode="dpsa",
        termination_threshold=1.0,
        valid_steps_per_step=25,
        seed=0,
        faults=FaultSettings(worker_timeout_s=60.0),
    )
    owner = FixedPolicy(SpaceRandomPolicy(gym.spaces.Discrete(2)))
    try:
        dm.start(owner)
        for _ in range(3):
            dm.publish(owner)
            rollout = dm.prefetcher.get(timeout=60.0)
            assert int(rollout.valid.sum()) == rollout.stats.valid_steps == 30
            assert rollout.stats.global_resets == 3
            owner.policy_version += 1
    finally:
        dm.stop()


def test_bad_input_names_the_flag(tmp_path: Path) -> None:
    base = ["--out", str(tmp_path)]
    with pytest.raises(SystemExit, match="--env must be a registered gymnasium id"):
        parse_args(["--env", "NoSuchEnv-v9", *base])
    with pytest.raises(SystemExit, match="--budget-s .* too short to evaluate once.*--eval-every-s"):
        parse_args(["--env", "CartPole-v1", "--budget-s", "5", "--eval-every-s", "10", *base])
    with pytest.raises(SystemExit, match="--clips must be >= 1, got 0"):
        parse_args(["--env", "CartPole-v1", "--clips", "0", *base])
    with pytest.raises(SystemExit, match="--modes must be from"):
        parse_args(["--env", "CartPole-v1", "--modes", "dpsa2", *base])
    assert parse_args(["--quick", *base]).seeds == [0]
    with pytest.raises(SystemExit, match="--peer sb3 and --no-peer exclude each other"):
        parse_args(["--env", "CartPole-v1", "--peer", "sb3", "--no-peer", *base])
    with pytest.raises(SystemExit):  # argparse: invalid choice
        parse_args(["--env", "CartPole-v1", "--peer", "rllib", *base])
    assert parse_args(["--env", "CartPole-v1", *base]).peer == "sb3"  # stable_baselines3 is installed
    assert parse_args(["--env", "CartPole-v1", "--no-peer", *base]).peer is None


@pytest.mark.benchmark
def test_quick_smoke(tmp_path: Path) -> None:
    """Two modes, one seed, a few seconds each on CartPole: outputs, fairness and curve invariants."""
    out = main(
        [
            "--env",
            "CartPole-v1",
            "--modes",
            "sequential",
            "dpsa1.0",
            "--clips",
            "2",
            "--workers",
            "2",
            "--seeds",
            "0",
            "--budget-s",
            "6",
            "--eval-every-s",
            "3",
            "--eval-episodes",
            "2",
            "--valid-steps-per-update",
            "64",
            "--scenario-load-cost-s",
            "0",
            "--no-peer",
            "--out",
            str(tmp_path),
        ]
    )
    for name in ("convergence.md", "convergence.json", "convergence.png"):
        assert (tmp_path / name).stat().st_size > 0
    runs = out["runs"]
    assert [r["label"] for r in runs] == ["sequential", "dpsa1.0"]
    for r in runs:
        assert r["updates"] >= 1 and r["valid_steps"] >= 64 * r["updates"]
        ts = [c["t"] for c in r["curve"]]
        assert ts[0] == 0.0 and ts == sorted(ts) and ts[-1] >= 6.0
        assert all(c["return"] >= 1.0 for c in r["curve"])  # CartPole: at least one step's reward
    s = json.loads((tmp_path / "convergence.json").read_text())["summary"]
    assert s["target"] == pytest.approx(0.9 * s["best_final_mean"])
    assert "not run" in (tmp_path / "convergence.md").read_text()


# ---------------------------------------------------------------------- the SB3 peer
def _untrained_sb3(seed: int = 0):
    from stable_baselines3 import PPO as Sb3PPO

    return Sb3PPO("MlpPolicy", gym.make("CartPole-v1"), n_steps=64, batch_size=64, seed=seed, device="cpu")


def _actions(act, observations: np.ndarray) -> list[int]:
    return [act(o, i) for i, o in enumerate(observations)]


def test_sb3_act_fn_greedy_is_argmax_and_sampling_reproduces_under_a_reseed() -> None:
    import torch

    from benchmarks.convergence.sb3 import sb3_act_fn
    from fastlight.evaluation import run_episodes

    model = _untrained_sb3()
    obs = np.random.default_rng(0).uniform(-0.2, 0.2, size=(200, 4)).astype(np.float32)
    greedy = _actions(sb3_act_fn(model, deterministic=True), obs)
    assert all(type(a) is int and a in (0, 1) for a in greedy)  # a plain int for a Discrete space
    with torch.no_grad():
        probs = model.policy.get_distribution(torch.as_tensor(obs)).distribution.probs
    assert greedy == probs.argmax(dim=1).tolist()
    sample = sb3_act_fn(model, deterministic=False)
    torch.manual_seed(7)
    first = _actions(sample, obs)
    torch.manual_seed(7)
    assert _actions(sample, obs) == first  # SB3 samples from torch's generator: a reseed replays
    torch.manual_seed(8)
    assert _actions(sample, obs) != first
    # An untrained policy is near 50/50 on CartPole: sampled actions are not its argmax everywhere.
    assert 20 < sum(a != g for a, g in zip(first, greedy, strict=True)) < 180
    # Through run_episodes, as the benchmark evaluates: same seeds + same torch seed = same episodes.
    plays = []
    for _ in range(2):
        torch.manual_seed(100_000)
        plays.append([(e.length, e.ret) for e in run_episodes("CartPole-v1", sample, episodes=3, seed=5)])
    assert plays[0] == plays[1]
    assert all(length >= 1 and ret == float(length) for length, ret in plays[0])  # +1 per CartPole step


def test_sb3_snapshots_exclude_start_up_and_stop_after_the_budget(tmp_path: Path) -> None:
    """A real SB3 PPO on 2 CartPole envs for 1 s: snapshots at t = 0 and every 0.4 s of training, the
    stop right after the first update past the budget, and every snapshot evaluable."""
    from stable_baselines3 import PPO as Sb3PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from benchmarks.convergence.sb3 import (
        EnvFactory,
        Sb3RunConfig,
        Sb3WallClockSnapshots,
        evaluate_sb3_run,
    )

    cfg = Sb3RunConfig(
        env_id="CartPole-v1",
        num_envs=2,
        seed=0,
        budget_s=1.0,
        every_s=0.4,
        valid_steps_per_update=64,
        scenario_load_cost_s=0.0,
        folder=str(tmp_path),
    )
    assert cfg.n_steps == 32  # 2 envs x 32 = 64 transitions per update
    venv = DummyVecEnv([EnvFactory(cfg.env_id, 0.0) for _ in range(cfg.num_envs)])
    model = Sb3PPO("MlpPolicy", venv, n_steps=cfg.n_steps, seed=0, device="cpu", **cfg.model)
    snaps = Sb3WallClockSnapshots(tmp_path, every_s=cfg.every_s, budget_s=cfg.budget_s)
    model.learn(total_timesteps=10**9, callback=snaps)
    venv.close()
    metas = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("snap_*.json"))]
    assert len(metas) == snaps.snapshots == len(list(tmp_path.glob("snap_*.zip"))) >= 3
    assert metas[0] == {"t": 0.0, "updates": 0, "valid_steps": 0}
    ts = [m["t"] for m in metas]
    assert ts == sorted(ts) and ts[-1] == snaps.elapsed >= cfg.budget_s
    assert all(m["valid_steps"] == 64 * m["updates"] for m in metas)
    # Stopped at the first env step after the last update: k rollouts of 64, plus that one vector step.
    assert model.num_timesteps == 64 * snaps.updates + cfg.num_envs
    summary = {"folder": str(tmp_path), "env_id": "CartPole-v1"}
    curve = evaluate_sb3_run(summary, episodes=2, seed=100_000)
    assert [c["t"] for c in curve] == ts and all(c["return"] >= 1.0 for c in curve)
    assert evaluate_sb3_run(summary, episodes=2, seed=100_000) == curve  # torch reseeded per snapshot


def test_sb3_n_steps_never_leaves_a_one_transition_minibatch() -> None:
    from benchmarks.convergence.sb3 import Sb3RunConfig

    def n_steps(valid: int, envs: int) -> int:
        return Sb3RunConfig("CartPole-v1", envs, 0, 10.0, 5.0, valid, 0.0, "x").n_steps

    assert n_steps(256, 10) == 26  # fastlight's autoreset rounding: ceil(256 / 10)
    assert n_steps(65, 1) == 66  # 65 % 64 == 1 would normalise one advantage alone (NaN)


def _curve(ts: list[float], rs: list[float]) -> tuple[list[float], list[float]]:
    return ts, rs


def test_race_to_peer_final_on_synthetic_curves() -> None:
    t = [0.0, 10.0, 20.0, 30.0]
    modes = {"sequential": [_curve(t, [0, 2, 4, 9])], "dpsa1.0": [_curve(t, [0, 5, 9, 10])]}
    race = race_to_peer_final(modes, [_curve(t, [0, 3, 6, 8])], budget_s=30.0)
    assert race["peer_final"] == 8.0
    assert race["times"] == {"sequential": [30.0], "dpsa1.0": [20.0]}
    assert race["best_mode"] == "dpsa1.0" and race["best_time"][0] == 20.0 and race["peer_time"][0] == 30.0
    assert race["met"] is True and race["bound"] == "" and race["speedup"][0] == pytest.approx(1.5)
    # Two peer seeds: final mean 7; the seed ending at 6 never gets there -> the peer's time is censored.
    race = race_to_peer_final(modes, [_curve(t, [0, 3, 6, 8]), _curve(t, [0, 1, 2, 6])], budget_s=30.0)
    assert race["peer_final"] == 7.0 and math.isinf(race["peer_time"][0])
    assert race["met"] is True and race["bound"] == ">="
    assert race["speedup"][0] == pytest.approx(30.0 / 20.0)  # censored at the budget
    # fastlight never gets there: missed, bounded from above.
    race = race_to_peer_final({"sgr": [_curve(t, [0, 1, 1, 1])]}, [_curve(t, [0, 3, 6, 8])], budget_s=30.0)
    assert race["met"] is False and race["bound"] == "<=" and math.isinf(race["best_time"][0])
    # A tie is not "sooner"; the first listed mode wins a tie between modes.
    race = race_to_peer_final(
        {"a": [_curve(t, [0, 8, 8, 8])], "b": [_curve(t, [0, 9, 9, 9])]},
        [_curve(t, [0, 8, 8, 8])],
        budget_s=30,
    )
    assert race["best_mode"] == "a" and race["best_time"][0] == race["peer_time"][0] == 10.0
    assert race["met"] is False and race["speedup"][0] == 1.0
    with pytest.raises(ValueError, match="at least one peer run"):
        race_to_peer_final(modes, [], budget_s=30.0)


def test_the_peer_has_a_row_and_a_line_but_does_not_set_the_target() -> None:
    t = [0.0, 10.0, 20.0]

    def run(label: str, rs: list[float]) -> dict:
        curve = [{"t": a, "return": r} for a, r in zip(t, rs, strict=True)]
        return {"label": label, "curve": curve, "valid_steps": 600, "train_s": 20.0, "updates": 3}

    runs = [run("sequential", [0, 4, 10]), run("dpsa1.0", [0, 12, 12]), run(SB3_LABEL, [0, 6, 20])]
    s = summarise(runs, ["sequential", "dpsa1.0"], 0.9, 20.0, peers=[SB3_LABEL])
    assert s["best_final_mean"] == 12.0 and s["target"] == pytest.approx(10.8)  # not SB3's 20
    assert s["modes"][SB3_LABEL]["final_return"][0] == 20.0
    assert s["modes"][SB3_LABEL]["time_to_target"][0] == 20.0
    race = s["peer_race"][SB3_LABEL]
    assert race["peer_final"] == 20.0 and race["met"] is False and race["bound"] == "<="
    line = target_lines(s)[-1]
    assert line.startswith("- **MISSED**: fastlight reaches SB3's final return (20.00) sooner than SB3 does")
    assert "SB3 after 20.0" in line and "best mode sequential after never" in line
    no_peer = summarise(runs[:2], ["sequential", "dpsa1.0"], 0.9, 20.0)
    assert "peer_race" not in no_peer and target_lines(no_peer)[-1].startswith("- not run:")


@pytest.mark.benchmark
def test_sb3_peer_end_to_end(tmp_path: Path) -> None:
    """The peer beside one mode on CartPole, a few seconds each, with an emulated load on every reset:
    its row, curve and target line; a rerun with the same settings reuses both runs."""
    argv = [
        "--env",
        "CartPole-v1",
        "--modes",
        "sequential",
        "--peer",
        "sb3",
        "--clips",
        "2",
        "--workers",
        "1",
        "--seeds",
        "0",
        "--budget-s",
        "4",
        "--eval-every-s",
        "2",
        "--eval-episodes",
        "2",
        "--valid-steps-per-update",
        "64",
        "--scenario-load-cost-s",
        "0.05",
        "--out",
        str(tmp_path),
    ]
    out = main(argv)
    runs = out["runs"]
    assert [r["label"] for r in runs] == ["sequential", SB3_LABEL]
    sb3 = runs[1]
    assert sb3["num_envs"] == 2 and sb3["n_steps"] == 32 and sb3["updates"] >= 1
    assert sb3["valid_steps"] == 64 * sb3["updates"]
    ts = [c["t"] for c in sb3["curve"]]
    assert ts[0] == 0.0 and ts == sorted(ts) and ts[-1] >= 4.0 and len(ts) == sb3["snapshots"]
    assert all(c["return"] >= 1.0 for c in sb3["curve"])
    s = out["summary"]
    assert SB3_LABEL in s["modes"] and s["target"] == pytest.approx(
        0.9 * s["modes"]["sequential"]["final_return"][0]
    )
    md = (tmp_path / "convergence.md").read_text()
    assert f"| {SB3_LABEL} | 1 |" in md and "SubprocVecEnv` of 2 envs" in md
    assert "fastlight reaches SB3's final return" in md and "no SB3 run" not in md
    folder = Path(sb3["folder"])
    stamp = (folder / "summary.json").stat().st_mtime_ns
    again = main(argv)
    assert (folder / "summary.json").stat().st_mtime_ns == stamp  # reused, not retrained
    assert again["runs"][1]["curve"] == sb3["curve"]
