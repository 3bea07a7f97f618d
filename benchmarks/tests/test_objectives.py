"""The objectives study: grid, shards, merge, rliable statistics, bad input, and a tiny real run."""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from benchmarks.objectives import __main__ as objectives
from benchmarks.objectives.grid import (
    GridConfig,
    grid_runs,
    parse_shard,
    shard_runs,
    variant_settings,
)
from benchmarks.objectives.stats import aggregate, improvement, normalise, score_matrix


def _grid(**kw) -> GridConfig:
    base = {
        "envs": ("InvertedPendulum-v5", "Reacher-v5", "Hopper-v5"),
        "variants": ("ppo", "sapo", "gipo0.2", "gipo0.5", "gipo1.0"),
        "lags": (0, 1, 3),
        "seeds": (0, 1, 2),
        "budget": 1000,
    }
    return GridConfig(**{**base, **kw})


@pytest.mark.parametrize("count", [1, 2, 7, 45, 200])
def test_shards_cover_the_grid_exactly_once(count: int) -> None:
    runs = grid_runs(_grid())
    assert len(runs) == 3 * 5 * 3 * 3
    seen = Counter(r for i in range(count) for r in shard_runs(runs, i, count))
    assert set(seen) == set(runs)
    assert set(seen.values()) == {1}
    sizes = [len(shard_runs(runs, i, count)) for i in range(count)]
    assert max(sizes) - min(sizes) <= 1  # balanced
    assert shard_runs(runs, 0, count) == shard_runs(grid_runs(_grid()), 0, count)  # deterministic


def test_fingerprint_changes_with_every_setting_that_shapes_a_run() -> None:
    g = _grid()
    assert g.fingerprint() == _grid().fingerprint()
    assert GridConfig.from_json(json.loads(json.dumps(g.to_json()))) == g
    for change in ({"budget": 2000}, {"seeds": (0, 1)}, {"lags": (1,)}, {"num_envs": 4}, {"last_k": 5}):
        assert _grid(**change).fingerprint() != g.fingerprint(), change


def _write_shard(root: str, grid: GridConfig, runs: list[str]) -> str:
    path = objectives.shard_dir(root, grid)
    for name in runs:
        with open(os.path.join(path, "runs", f"{name}.json"), "w") as f:
            json.dump({"run": name}, f)
    return path


def test_merge_combines_shards_of_one_grid_and_refuses_mixed_grids(tmp_path) -> None:
    g = _grid()
    names = [r.name for r in grid_runs(g)]
    a = _write_shard(str(tmp_path / "a"), g, names[:3])
    b = _write_shard(str(tmp_path / "b"), g, names[3:5])
    grid, results, _ = objectives.load_shards([str(tmp_path / "a"), b])
    assert grid == g
    assert [r["run"] for r in results] == sorted(names[:5])
    other = _write_shard(str(tmp_path / "c"), _grid(budget=2000), names[:1])
    with pytest.raises(ValueError, match="^--merge: .*different grids"):
        objectives.load_shards([a, other])


def test_iqm_and_mean_match_a_hand_computation() -> None:
    rng = np.random.default_rng(0)
    matrix = {"x": rng.normal(size=(4, 3)), "y": rng.normal(size=(4, 3)) + 10.0}
    agg = aggregate(matrix, reps=200)
    for name, m in matrix.items():
        # IQM = the 25% trimmed mean over all runs x envs (Agarwal et al. 2021).
        np.testing.assert_allclose(agg[name]["iqm"], stats.trim_mean(m, 0.25, axis=None), rtol=1e-12)
        np.testing.assert_allclose(agg[name]["mean"], m.mean(), rtol=1e-12)
        lo, hi = agg[name]["iqm_ci"]
        assert lo <= agg[name]["iqm"] <= hi and lo < hi
    # Tiny case by hand: 12 values 0..11, trimming 3 each side leaves 3..8, mean 5.5.
    hand = aggregate({"z": np.arange(12.0).reshape(4, 3)}, reps=100)["z"]
    assert hand["iqm"] == pytest.approx(5.5) and hand["mean"] == pytest.approx(5.5)


def test_probability_of_improvement() -> None:
    low, high = np.zeros((3, 2)), np.ones((3, 2))
    high[0, 0] = -1.0  # env 0: (-1, 1, 1) vs (0, 0, 0) wins 6 of 9 pairs; env 1 wins 9 of 9
    p = improvement({"a": high, "b": low}, "a", "b", reps=100)
    assert p["p"] == pytest.approx((6 / 9 + 1.0) / 2)
    assert p["ci"][0] <= p["p"] <= p["ci"][1] <= 1.0
    assert improvement({"a": low, "b": low}, "a", "b", reps=20)["p"] == pytest.approx(0.5)


def test_normalisation_and_score_matrix() -> None:
    assert normalise(-40.0, random=-40.0, reference=-5.0) == 0.0
    assert normalise(-5.0, random=-40.0, reference=-5.0) == 1.0
    assert normalise(-22.5, random=-40.0, reference=-5.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="equals the random score"):
        normalise(1.0, random=3.0, reference=3.0)
    scores = {(v, e, s): 10 * s + (e == "B") for v in ("p", "q") for e in ("A", "B") for s in (0, 1)}
    m = score_matrix(scores, variants=["p", "q"], envs=["A", "B"], seeds=[0, 1])
    np.testing.assert_array_equal(m["p"], [[0, 1], [10, 11]])


def test_variant_settings() -> None:
    from fastlight.modules.objectives import GIPO, SAPO, PPOClip, as_objective

    gipo = {"class_path": f"{GIPO.__module__}.GIPO", "init_args": {"sigma": 0.2, "clip_frac_eps": 0.2}}
    assert variant_settings("gipo0.2") == {"objective": gipo}  # JSON, as the grid is

    def built(name: str) -> object:
        return as_objective(variant_settings(name)["objective"], default=PPOClip)

    assert built("gipo0.2") == GIPO(sigma=0.2)
    assert built("sapo") == SAPO(tau_pos=1.0, tau_neg=1.05)
    assert built("ppo") == PPOClip(clip_eps=0.2)
    assert parse_shard("2/5") == (2, 5)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--variants", "ppo", "trpo"], "--variants"),
        (["--variants", "gipo0"], "--variants"),
        (["--variants", "gipo-0.5"], "--variants"),
        (["--envs", "CartPole-v1"], "--envs"),
        (["--lags", "-1"], "--lags"),
        (["--shard", "3/3"], "--shard"),
        (["--shard", "x"], "--shard"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(argv, flag, tmp_path, capsys) -> None:
    assert objectives.main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {flag}") and "\n" not in err
    assert os.listdir(tmp_path) == []  # refused before any run started


def test_mixed_merge_is_one_line_naming_the_flag(tmp_path, capsys) -> None:
    a = _write_shard(str(tmp_path / "a"), _grid(), [])
    b = _write_shard(str(tmp_path / "b"), _grid(seeds=(0,)), [])
    assert objectives.main(["--merge", a, b]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --merge") and "\n" not in err


@pytest.mark.benchmark
def test_tiny_grid_end_to_end(tmp_path) -> None:
    """Real runs (MuJoCo, sampler process, Trainer): 1 env x 2 variants x 1 seed, very short."""
    out, results = tmp_path / "runs", tmp_path / "results"
    argv = ["--envs", "InvertedPendulum-v5", "--variants", "ppo", "gipo0.2", "--lags", "1"]
    argv += ["--seeds", "0", "--budget", "2048", "--last-k", "2", "--out", str(out)]
    argv += ["--throughput-rounds", "2"]
    assert objectives.main([*argv, "--results", str(results)]) == 0
    summary = json.loads((results / "objectives.json").read_text())
    assert summary["throughput_interleaved"]["InvertedPendulum-v5"]["sampler_tps"] > 0
    runs = summary["runs"]
    assert len(runs) == 2
    for r in runs:
        assert r["env_steps"] == 2048 and r["updates"] == 4
        assert 0.0 < r["mean_lag"] <= 1.0 and r["max_lag"] <= 1  # data really carries older versions
        assert r["score"] is not None and r["sampler_tps"] > 0 and r["plain_loop_tps"] > 0
    block = summary["by_lag"]["1"]
    assert 0.0 <= block["p_improvement_gipo0.2_over_ppo"]["p"] <= 1.0
    assert max(max(row) for m in block["matrix"].values() for row in m) == pytest.approx(1.0)
    assert (results / "objectives_profile_lag1.png").stat().st_size > 0
    assert "AcceRL" in (results / "objectives.md").read_text()
    # A rerun of the same grid resumes: every run is found done, nothing is trained again.
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.json") if p.parent.name == "runs"}
    assert objectives.main([*argv, "--results", str(results)]) == 0
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps


def test_summary_normalises_per_env_and_leaves_out_an_env_no_run_beat_random(tmp_path) -> None:
    from benchmarks.objectives.report import markdown, summarise

    grid = _grid(envs=("Hopper-v5", "Reacher-v5"), variants=("ppo", "gipo0.2"), lags=(1,), seeds=(0, 1))
    (tmp_path / "random_scores.json").write_text(json.dumps({"Hopper-v5": 10.0, "Reacher-v5": -40.0}))
    hopper = {("ppo", 0): 60.0, ("ppo", 1): 110.0, ("gipo0.2", 0): 210.0, ("gipo0.2", 1): 10.0}
    results = [
        {
            "variant": v, "env": env, "lag": 1, "seed": seed, "mean_lag": 1.0, "max_lag": 1,
            "dropped_stale": 0, "sampler_tps": 80.0, "end_to_end_tps": 50.0, "plain_loop_tps": 100.0,
            "score": hopper[(v, seed)] if env == "Hopper-v5" else -55.0 - seed, "curve": [],
        }
        for env in grid.envs for v in grid.variants for seed in grid.seeds
    ]  # fmt: skip
    summary = summarise(grid, results, str(tmp_path), reps=20)
    assert summary["reference_score"]["Hopper-v5"] == 210.0
    assert summary["envs_left_out"] == ["Reacher-v5"]  # every run below the random policy's -40
    np.testing.assert_allclose(summary["by_lag"]["1"]["matrix"]["ppo"], [[0.25], [0.5]])
    np.testing.assert_allclose(summary["by_lag"]["1"]["matrix"]["gipo0.2"], [[1.0], [0.0]])
    assert summary["throughput"]["Hopper-v5"]["sampler_ratio"] == pytest.approx(0.8)
    assert "Left out of the aggregates: Reacher-v5" in markdown(grid, summary, "cmd")


def test_interleaved_throughput_ratio_and_verdict() -> None:
    """A real Collector on a MuJoCo env against the plain loop: positive rates, the ratio is their
    quotient, and the table says met / missed against the 70% target."""
    from benchmarks.objectives.throughput import TARGET_RATIO, markdown, measure_env

    r = measure_env("InvertedPendulum-v5", num_envs=4, rollout_steps=8, rounds=2, plain_steps=64)
    assert r["plain_loop_tps"] > 0 and r["sampler_tps"] > 0
    assert r["ratio"] == pytest.approx(r["sampler_tps"] / r["plain_loop_tps"])
    assert r["ratio_min"] <= r["ratio_median"] <= r["ratio_max"]
    low = {**r, "ratio": TARGET_RATIO - 0.05}
    assert "missed by 5%" in markdown({"InvertedPendulum-v5": low}, command="cmd")
    assert "| met |" in markdown({"InvertedPendulum-v5": {**r, "ratio": TARGET_RATIO}}, command="cmd")


def test_throughput_bad_input_names_the_flag(capsys) -> None:
    from benchmarks.objectives import throughput as objectives_throughput

    with pytest.raises(SystemExit):
        objectives_throughput.main(["--envs", "Pong-v5"])
    assert "--envs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        objectives_throughput.main(["--rounds", "0"])
    assert "--rounds must be >= 1" in capsys.readouterr().err
