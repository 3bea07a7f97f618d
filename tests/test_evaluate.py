"""``fastlight evaluate`` on real checkpoints: seeded full episodes, statistics, GIFs, refusals."""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from fastlight.evaluate import main

ROOT = Path(__file__).resolve().parents[1]
HIGHWAY = str(ROOT / "configs" / "highway_dpsa.yaml")


def test_highway_episodes_are_full_seeded_and_replayable(highway_run, tmp_path, capsys):
    import imageio.v3 as iio

    from fastlight.envs.registry import make_env
    from fastlight.evaluation import policy_act_fn
    from fastlight.modules.loading import load_module
    from tests.eval_modules import NarrowModule

    ckpt = highway_run / "checkpoints" / "last.ckpt"
    out, video = tmp_path / "eval.json", tmp_path / "gifs"
    result = main(
        ["--ckpt", str(ckpt), "--episodes", "2", "--seed", "5", "--video", str(video), "--out", str(out)]
    )
    captured = capsys.readouterr()
    printed = captured.out
    assert "mean return" in printed and "crash rate" in printed and "success rate    not reported" in printed
    # progress on stderr, at the end at least (a long evaluation is not silent)
    assert "fastlight evaluate: 2 of 2 episodes, " in captured.err
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))

    # The checkpoint's own subclass was rebuilt, and the env from its data settings, DPSA off.
    assert result["module"] == "tests.eval_modules.NarrowModule"
    assert result["env_id"] == "highway-fast-v0" and result["policy_version"] == 2
    rows = result["episodes"]
    assert [r["seed"] for r in rows] == [5, 6]
    # Natural ends only: a crash (terminated) or highway-env's 30-step duration (truncated); the
    # training run's max_horizon of 5 does not apply here.
    assert all(r["terminated"] or (r["truncated"] and r["length"] == 30) for r in rows), rows
    assert all(r["crashed"] is not None and r["success"] is None for r in rows)

    # Determinism: a replay of each seed with the same greedy policy sums to the same return.
    module = load_module(ckpt)
    assert type(module).__name__ == NarrowModule.__name__ and module.policy.actor[0].out_features == 8
    act = policy_act_fn(module.policy, deterministic=True)
    env = make_env("highway-fast-v0")
    for r in rows:
        obs, _ = env.reset(seed=r["seed"])
        total, steps, done = 0.0, 0, False
        while not done:
            obs, reward, term, trunc, _ = env.step(act(obs, steps))
            total, steps, done = total + float(reward), steps + 1, term or trunc
        # Same process, same kernels, same inputs: bitwise (rendering did not change the dynamics).
        assert (total, steps) == (r["return"], r["length"])
    env.close()

    s = result["summary"]
    returns = np.array([r["return"] for r in rows])
    assert s["episodes"] == 2 and s["return"]["mean"] == pytest.approx(returns.mean(), rel=1e-12)
    assert s["return"]["ci_low"] <= s["return"]["mean"] <= s["return"]["ci_high"]
    # A percentile bootstrap of the mean stays within the data (up to float round-off).
    assert returns.min() - 1e-9 <= s["return"]["ci_low"] and s["return"]["ci_high"] <= returns.max() + 1e-9
    assert s["length"]["mean"] == pytest.approx(np.mean([r["length"] for r in rows]))
    crash = s["crash_rate"]
    assert crash["count"] == sum(r["crashed"] for r in rows) and crash["rate"] == crash["count"] / 2
    assert crash["ci_low"] <= crash["rate"] <= crash["ci_high"] and crash["ci_high"] - crash["ci_low"] > 0.3
    assert s["success_rate"] is None  # highway-env reports no success

    # One GIF per episode: the reset frame and one per step, highway-env's 600x150 screen.
    gifs = sorted(video.glob("*.gif"))
    assert [g.name for g in gifs] == [f"episode_{i:03d}_seed{5 + i}.gif" for i in range(2)]
    for g, r in zip(gifs, rows, strict=True):
        frames = iio.imread(g, index=None)
        assert frames.shape == (r["length"] + 1, 150, 600, 3) and frames.shape[0] > 1
        assert np.abs(frames[-1].astype(int) - frames[0]).sum() > 0  # the cars moved


def test_highway_reports_fasts_driving_metrics_with_intervals(highway_run, tmp_path, capsys):
    """On a highway-env id the driving metrics come by themselves: printed, in the JSON with 95%
    intervals, per episode in the rows, and equal to DrivingMetrics over a replay of the same seeds."""
    from fastlight.envs.registry import make_env
    from fastlight.evaluation import policy_act_fn
    from fastlight.metrics.driving import (
        METRICS,
        NOT_IN_HIGHWAY_ENV,
        DrivingMetrics,
        EpisodeTracker,
        read_driving_state,
    )
    from fastlight.modules.loading import load_module
    from fastlight.stats import stratified_mean_ci

    ckpt, out = highway_run / "checkpoints" / "last.ckpt", tmp_path / "eval.json"
    result = main(["--ckpt", str(ckpt), "--episodes", "4", "--seed", "5", "--out", str(out)])
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    driving = saved["summary"]["driving"]
    assert list(driving) == list(METRICS) and driving == result["summary"]["driving"]

    # The same seeds replayed by hand, each state read after reset and after every step.
    act = policy_act_fn(load_module(ckpt).policy, deterministic=True)
    env, metric = make_env("highway-fast-v0"), DrivingMetrics()
    for row in saved["episodes"]:
        obs, _ = env.reset(seed=row["seed"])
        tracker = EpisodeTracker(1.0 / env.unwrapped.config["policy_frequency"])
        tracker.reset(read_driving_state(env.unwrapped))
        steps, done = 0, False
        while not done:
            obs, _, term, trunc, _ = env.step(act(obs, steps))
            tracker.step(read_driving_state(env.unwrapped))
            steps, done = steps + 1, term or trunc
        episode = tracker.finish()
        assert row["driving"] == asdict(episode) and row["driving"]["steps"] == row["length"]
        metric.update(episode)
    env.close()
    for key, value in metric.compute().items():
        m = driving[key]
        if key == "parking_error_m":  # no parking goal on a highway: n/a in this scene
            assert m is None and math.isnan(float(value))
            assert re.search(r"^    parking_error_m +n/a in this scene$", printed, re.M)
            continue
        assert m["value"] == pytest.approx(float(value), rel=1e-12), key
        assert m["ci_low"] <= m["value"] <= m["ci_high"], (key, m)
        line = f"    {key:<27} {m['value']:.4g}  [{m['ci_low']:.4g}, {m['ci_high']:.4g}]"
        assert line in printed.splitlines(), (line, printed)
    # An episode mean's interval is the bootstrap over the four episodes that the return's uses too.
    lengths = np.asarray([r["length"] for r in saved["episodes"]], dtype=float)
    mean, low, high = stratified_mean_ci({"all": lengths}, n_boot=10_000, seed=5)
    assert low < high and len(set(lengths)) > 1  # not a point: the episodes differ
    assert tuple(driving["episode_steps"].values()) == pytest.approx((mean, low, high), rel=1e-12)
    assert "  driving metrics (FAST §5), 95% CI: percentile bootstrap over episodes" in printed
    for key, why in NOT_IN_HIGHWAY_ENV.items():
        assert f"    {key:<27} n/a: {why}" in printed.splitlines()


def test_metrics_flag_turns_the_driving_metrics_off_or_refuses_a_non_highway_env(
    highway_run, tmp_path, capsys
):
    ckpt, out = str(highway_run / "checkpoints" / "last.ckpt"), tmp_path / "eval.json"
    result = main(["--ckpt", ckpt, "--episodes", "1", "--metrics", "basic", "--out", str(out)])
    assert "driving" not in result["summary"] and "driving" not in result["episodes"][0]
    assert "driving metrics" not in capsys.readouterr().out and result["summary"]["crash_rate"] is not None
    with pytest.raises(SystemExit) as e:
        main(["--ckpt", ckpt, "--env", "CartPole-v1", "--metrics", "driving", "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "fastlight evaluate: error: --metrics driving: CartPole-v1 is not a highway-env scene, whose "
        "simulator the driving metrics read (highway-fast-v0, merge-v0, roundabout-v0, ...); leave "
        "--metrics out or give basic"
    ]


def test_unimportable_module_class_names_it(highway_run, tmp_path, capsys):
    ckpt = torch.load(highway_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    ckpt["hyper_parameters"]["_class_path"] = "my_missing_package.tasks.MyModule"
    path = tmp_path / "moved.ckpt"
    torch.save(ckpt, path)
    with pytest.raises(SystemExit) as e:
        main(["--ckpt", str(path), "--episodes", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "--ckpt: cannot import the checkpoint's module class 'my_missing_package.tasks.MyModule'" in err[0]
    assert "PYTHONPATH" in err[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--episodes", "2"], "the following arguments are required: --ckpt"),
        (["--ckpt", "{ckpt}", "--episodes", "0"], "--episodes must be >= 1, got 0"),
        (["--ckpt", "{ckpt}", "--episodes", "two"], "argument --episodes: invalid int value: 'two'"),
        (["--ckpt", "{missing}"], "--ckpt: no checkpoint file at {missing}"),
        (["--ckpt", "{text}"], "--ckpt: {text} is not a readable checkpoint"),
        (["--ckpt", "{ckpt}", "--env-kwargs", "[1]"], "--env-kwargs must be a JSON object, got '[1]'"),
        (["--ckpt", "{ckpt}", "--out", "x.txt"], "--out must name a .json file, got 'x.txt'"),
        (["--ckpt", "{ckpt}", "--env", "highway-fats-v0"], "--env must be a registered gymnasium id"),
        (
            ["--ckpt", "{ckpt}", "--metrics", "all"],
            "argument --metrics: invalid choice: 'all' (choose from 'driving', 'basic')",
        ),
        (  # the id comes from the checkpoint, not from --env: the message says so
            ["--ckpt", "{own}"],
            "the checkpoint's data.env_id (from {own}; or give --env) must be a registered gymnasium id, "
            "got 'mytask/Uneven-v0'; an env your package registers on import is named as "
            "mytask:mytask/Uneven-v0",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(argv, message, tmp_path, capsys):
    ckpt, text, own = tmp_path / "model.ckpt", tmp_path / "notes.ckpt", tmp_path / "own.ckpt"
    torch.save({"state_dict": {}}, ckpt)
    torch.save({"state_dict": {}, "datamodule_hyper_parameters": {"env_id": "mytask/Uneven-v0"}}, own)
    text.write_text("not a checkpoint")
    paths = {"ckpt": ckpt, "missing": tmp_path / "none.ckpt", "text": text, "own": own}
    with pytest.raises(SystemExit) as e:
        main([a.format(**paths) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastlight evaluate: error: "), err
    assert message.format(**paths) in err[0]


def test_console_script_dispatches_evaluate_and_refuses_validate(monkeypatch, capsys):
    """``fastlight.cli.main`` (the console script) routes ``evaluate`` here before LightningCLI
    parses, and answers ``validate`` / ``test`` / ``predict`` with one line pointing here."""
    from fastlight.cli import main as fastlight

    monkeypatch.setattr(sys, "argv", ["fastlight", "evaluate", "--ckpt", "nowhere.ckpt"])
    with pytest.raises(SystemExit) as e:
        fastlight()
    assert e.value.code == 2
    assert (
        capsys.readouterr().err.strip()
        == "fastlight evaluate: error: --ckpt: no checkpoint file at nowhere.ckpt"
    )
    for sub in ("validate", "test", "predict"):
        monkeypatch.setattr(sys, "argv", ["fastlight", sub, "--config", HIGHWAY])
        with pytest.raises(SystemExit) as e:
            fastlight()
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"fastlight: error: `fastlight {sub}` is not available"), (
            err
        )
        assert "fastlight evaluate --ckpt PATH" in err[0]


@pytest.fixture(scope="module")
def vla_ckpt(tmp_path_factory) -> Path:
    """A 2-step SFT checkpoint of the VLA on Meta-World reach-v3 (state mode) with 10-step episodes."""
    from fastlight.cli import cli_main

    root = tmp_path_factory.mktemp("vla_sft")
    cli_main(
        ["fit", "--config", str(ROOT / "configs" / "vla_metaworld_mt10_sft.yaml"),
         "--data.demos_per_task", "1", "--data.num_workers", "0", "--data.cache_dir", str(root / "cache"),
         "--data.env_kwargs.tasks", "reach-v3", "--data.env_kwargs.max_path_length", "10",
         "--data.successful_only", "false", "--trainer.max_steps", "2",
         "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar", "false"]
    )  # fmt: skip
    assert (root / "checkpoints" / "last.ckpt").is_file(), sorted(root.rglob("*.ckpt"))
    return root / "checkpoints" / "last.ckpt"


@pytest.mark.slow  # demonstrations + 2 SFT steps + evaluation: ~10 s of CPU
def test_vla_metaworld_checkpoint_plays_every_task(vla_ckpt, tmp_path, capsys):
    from fastlight.evaluation import eval_seed

    result = main(["--ckpt", str(vla_ckpt), "--episodes", "2", "--seed", "3", "--video", str(tmp_path / "v")])
    # Default results file: beside the checkpoint, one per call, the latest also under a stable name.
    written = vla_ckpt.with_name("last.eval.json")
    assert json.loads(written.read_text())["summary"] == json.loads(json.dumps(result["summary"]))
    (own,) = vla_ckpt.parent.glob("last.eval-*-seed3.json")
    assert own.read_text() == written.read_text()
    assert result["module"] == "fastlight.VLASFTModule"  # the public name, as the CLI records it
    assert result["env_id"] == "fastlight/MetaWorld-v0" and result["task_names"] == ["reach-v3"]
    assert result["env_kwargs"]["max_path_length"] == 10  # the checkpoint's env settings
    rows = result["episodes"]
    # The multi-task evaluation's seeds (shared with python -m benchmarks.vla.eval), full episodes.
    assert [(r["task"], r["seed"]) for r in rows] == [("reach-v3", eval_seed(3, 0, i)) for i in range(2)]
    assert all(1 <= r["length"] <= 10 and r["success"] is not None for r in rows)
    s = result["summary"]
    assert s["success_rate"] is not None and s["crash_rate"] is None  # Meta-World reports success only
    k = sum(r["success"] for r in rows)
    assert (
        s["success_rate"]["count"] == k
        and s["success_rate"]["ci_low"] <= k / 2 <= s["success_rate"]["ci_high"]
    )
    assert result["per_task"]["per_task"]["reach-v3"]["episodes"] == 2
    # State mode has no camera: --video says so instead of writing empty files.
    assert "state mode has no camera frames" in capsys.readouterr().err
    assert result["videos"] == [] and not (tmp_path / "v").exists()
