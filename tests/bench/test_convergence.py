"""The convergence benchmark: its statistics against naive loops, the valid-step budget on a real
DataModule with a sampler process, bad input, and a tiny end-to-end run (``benchmark``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from fastlight.bench.convergence import main, parse_args
from fastlight.bench.convergence_stats import (
    bootstrap_diff_ci,
    bootstrap_mean_ci,
    bootstrap_ratio_ci,
    time_to_target,
)
from fastlight.bench.sampling_procs import FixedPolicy, SpaceRandomPolicy
from fastlight.data.datamodule import RolloutDataModule


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


def _naive_quantile_lower_higher(xs: list[float], level: float) -> tuple[float, float]:
    xs = sorted(xs)
    n, a = len(xs), (1 - level) / 2
    return xs[math.floor(a * (n - 1))], xs[math.ceil((1 - a) * (n - 1))]


def test_bootstrap_mean_ci_matches_a_naive_loop() -> None:
    values = [12.0, 30.0, 18.0, 25.0, 9.0]
    n_boot = 2000
    point, lo, hi = bootstrap_mean_ci(values, n_boot=n_boot, seed=3)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, len(values), size=(n_boot, len(values)))
    means = []
    for row in idx:  # one resample at a time, in plain Python
        total = 0.0
        for i in row:
            total += values[i]
        means.append(total / len(row))
    want_lo, want_hi = _naive_quantile_lower_higher(means, 0.95)
    assert point == pytest.approx(np.mean(values))
    assert (lo, hi) == pytest.approx((want_lo, want_hi), rel=1e-12)
    assert min(values) <= lo < point < hi <= max(values)


def test_bootstrap_keeps_censored_runs_infinite() -> None:
    point, lo, hi = bootstrap_mean_ci([10.0, math.inf, 20.0], n_boot=500)
    assert math.isinf(point) and math.isinf(hi) and lo == pytest.approx(10.0)
    assert bootstrap_mean_ci([5.0], n_boot=100) == (5.0, 5.0, 5.0)  # one seed: a point


def test_ratio_and_difference_cis_match_naive_loops() -> None:
    a, b = [40.0, 50.0, 45.0], [20.0, 30.0, 25.0, 22.0]
    n_boot = 1000
    r, rlo, rhi = bootstrap_ratio_ci(a, b, n_boot=n_boot, seed=1)
    rng = np.random.default_rng(1)
    ia = rng.integers(0, len(a), size=(n_boot, len(a)))
    ib = rng.integers(0, len(b), size=(n_boot, len(b)))
    ratios = [
        sum(a[i] for i in ra) / len(ra) / (sum(b[i] for i in rb) / len(rb))
        for ra, rb in zip(ia, ib, strict=True)
    ]
    assert r == pytest.approx(np.mean(a) / np.mean(b))
    assert (rlo, rhi) == pytest.approx(_naive_quantile_lower_higher(ratios, 0.95), rel=1e-12)
    d, dlo, dhi = bootstrap_diff_ci(a, b, n_boot=n_boot, seed=1)
    diffs = [
        sum(a[i] for i in ra) / len(ra) - sum(b[i] for i in rb) / len(rb)
        for ra, rb in zip(ia, ib, strict=True)
    ]
    assert d == pytest.approx(np.mean(a) - np.mean(b))
    assert (dlo, dhi) == pytest.approx(tuple(np.quantile(diffs, [0.025, 0.975])), rel=1e-12)
    assert dlo < d < dhi


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
        worker_timeout_s=60.0,
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
