"""``python -m benchmarks.driving``: refuses checkpoints it cannot compare, with one line
naming the flag; a ``benchmark`` smoke test trains two tiny highway checkpoints and compares them."""

from __future__ import annotations

import glob
import json
import os
import re

import pytest
import torch

from benchmarks.driving import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fake_ckpt(path, env_id: str, env_kwargs=None) -> str:
    """A checkpoint-shaped file: the bench reads its datamodule settings before any weights."""
    data = {"env_id": env_id, "env_kwargs": env_kwargs}
    torch.save({"state_dict": {}, "datamodule_hyper_parameters": data, "global_step": 0}, path)
    return str(path)


@pytest.mark.parametrize(
    ("envs", "message"),
    [
        (("highway-fast-v0", "merge-v0"), "was trained on 'merge-v0', --ckpt .* on 'highway-fast-v0'"),
        (
            ("CartPole-v1", "CartPole-v1"),
            ": the checkpoints were trained on 'CartPole-v1', not a highway",
        ),
    ],
)
def test_checkpoints_of_another_env_are_refused(tmp_path, capsys, envs, message):
    a, b = (_fake_ckpt(tmp_path / f"{i}.ckpt", env) for i, env in enumerate(envs))
    with pytest.raises(SystemExit) as err:
        main(["--ckpt", a, "--ckpt", b, "--out", str(tmp_path / "r")])
    assert err.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse: usage, then one error line
    assert re.search(r"error: --ckpt.*" + message, last), last
    assert not (tmp_path / "r.md").exists()


def test_env_flag_and_ckpt_count_are_checked(tmp_path, capsys):
    a = _fake_ckpt(tmp_path / "a.ckpt", "highway-fast-v0")
    for argv, message in [
        (["--ckpt", a], "--ckpt must be given exactly twice (A then B), got 1"),
        (["--ckpt", a, "--ckpt", a, "--env", "merge-v0"], "was trained on 'highway-fast-v0', but --env is"),
        (["--ckpt", a, "--ckpt", str(tmp_path / "none.ckpt")], "--ckpt: no checkpoint file at"),
        (["--ckpt", a, "--ckpt", a, "--episodes", "1"], "--episodes must be >= 2"),
    ]:
        with pytest.raises(SystemExit):
            main([*argv, "--out", str(tmp_path / "r")])
        assert message in capsys.readouterr().err, argv


def _tiny_fit(root, *extra: str) -> str:
    from fastlight.cli import cli_main

    cli_main([
        "fit", "--config", os.path.join(ROOT, "configs", "highway_dpsa.yaml"),
        "--trainer.max_steps", "16", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(root), "--data.steps_per_epoch", "1",
        "--data.cycles_per_step", "1", "--data.num_workers", "1", *extra,
    ])  # fmt: skip
    found = glob.glob(str(root / "**" / "last.ckpt"), recursive=True)
    assert found, f"no last.ckpt under {root}"
    return found[0]


@pytest.mark.benchmark
@pytest.mark.multiproc
def test_quick_compares_two_trained_checkpoints(tmp_path):
    a = _tiny_fit(tmp_path / "dpsa", "--data.num_envs", "2")
    b = _tiny_fit(tmp_path / "seq", "--data.reset_mode", "sequential", "--data.num_envs", "1")
    out = tmp_path / "driving"
    result = main(["--ckpt", a, "--ckpt", b, "--quick", "--out", str(out)])
    assert result["episodes"] == 3 and result["env_id"] == "highway-fast-v0"
    saved = json.loads((tmp_path / "driving.json").read_text())
    table = (tmp_path / "driving.md").read_text()
    for key in ("collision_rate", "min_ttc_s", "hard_brakes_per_100_steps", "efficiency", "return"):
        row = saved["metrics"][key]
        assert row["ci_low"] <= row["diff"] <= row["ci_high"], (key, row)
        assert f"| {key} |" in table
    # Both policies played the same seeds to their natural end: one DrivingEpisode per seed.
    for side in ("a", "b"):
        eps = saved[side]["episodes"]
        assert len(eps) == 3 == len(saved[side]["returns"])
        assert all(1 <= ep["steps"] <= 30 for ep in eps)  # highway-fast-v0: 30 s at 1 Hz at most
    assert "n/a in this scene" in table and "red_light_violation" in table
    assert saved["metrics"]["parking_error_m"]["a"] is None  # no parking goal on a highway


def _snapshot_run(folder, *, updates: int, seed: int) -> str:
    """A convergence run folder as ``benchmarks.convergence`` leaves it: ``summary.json`` and
    one ``snap_0000.pt`` (random weights, seeded)."""
    import torch

    from benchmarks.convergence.snapshots import run_policy
    from benchmarks.convergence.worker import PPO

    folder.mkdir(parents=True)
    summary = {
        "env_id": "highway-fast-v0", "obs_dim": 25, "action_dim": 5, "continuous": False,
        "model": dict(PPO), "folder": str(folder),
    }  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))
    torch.manual_seed(seed)
    policy = run_policy(summary)
    payload = {"policy": policy.state_dict(), "t": 12.5, "updates": updates, "valid_steps": 100}
    torch.save(payload, folder / "snap_0000.pt")
    return str(folder / "snap_0000.pt")


def test_convergence_snapshots_are_compared_like_checkpoints(tmp_path):
    import torch

    from benchmarks.convergence.snapshots import is_snapshot, load_snapshot

    a = _snapshot_run(tmp_path / "sequential_s0", updates=7, seed=1)
    b = _snapshot_run(tmp_path / "dpsa1.0_s0", updates=9, seed=2)
    assert is_snapshot(a) and not is_snapshot(tmp_path / "sequential_s0" / "summary.json")
    policy, summary, meta = load_snapshot(b)
    saved = torch.load(b, weights_only=True)["policy"]
    for name, value in policy.state_dict().items():
        assert torch.equal(value, saved[name]), name  # the snapshot's weights, exactly
    assert meta == {"t": 12.5, "updates": 9, "valid_steps": 100} and summary["env_id"] == "highway-fast-v0"
    out = tmp_path / "driving"
    result = main(["--ckpt", a, "--ckpt", b, "--quick", "--out", str(out)])
    assert result["a"]["global_step"] == 7 and result["b"]["global_step"] == 9
    table = (tmp_path / "driving.md").read_text()
    assert "convergence snapshot after 7 policy updates" in table
    assert "convergence snapshot after 9 policy updates" in table
    assert len(result["a"]["episodes"]) == 3


def test_a_policy_plays_and_is_recorded_as_fastlight_evaluate_does(highway_run, tmp_path, capsys):
    """The bench's side A is ``fastlight evaluate --sample`` on the same checkpoint and seeds: the same
    episodes, returns and per-episode driving sums (one player, one recorder)."""
    from dataclasses import asdict

    from benchmarks.driving import evaluate
    from fastlight.evaluate import main as fastlight_evaluate
    from fastlight.metrics.driving import DrivingThresholds

    ckpt = str(highway_run / "checkpoints" / "last.ckpt")
    argv = ["--ckpt", ckpt, "--episodes", "3", "--seed", "7", "--sample", "--out", str(tmp_path / "e.json")]
    rows = fastlight_evaluate(argv)["episodes"]
    run = evaluate("A", ckpt, episodes=3, seed=7, greedy=False, thresholds=DrivingThresholds())
    assert [asdict(ep) for ep in run.episodes] == [r["driving"] for r in rows]
    assert run.returns == [r["return"] for r in rows] and len({r["return"] for r in rows}) > 1
