"""Faults injected into real ``fastlight fit`` processes: SIGTERM / SIGINT after the first rollouts,
a NaN reward from the env, an impossible setting. Each asserts the exit code, the one-line
message, the time to stop, that no child process survives, and that the checkpoint on disk loads
and resumes (with the learning rate typed at resume time)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.procfs import descendants
from fastlight.cli import main
from fastlight.procs import alive

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "highway_dpsa.yaml")


def command(root: Path, *extra: str, env_kwargs: str = '{"step_sleep": 0.02}') -> list[str]:
    """A tiny, endless-looking run of the highway config on the fault-injecting env: 2 samplers,
    one env each, 8-step cycles, one update = 2 optimizer steps (only a signal or fault ends it)."""
    return [
        sys.executable,
        "-m",
        "fastlight.cli",
        "fit",
        "--config",
        CONFIG,
        "--data.env_id",
        "tests.fake_envs:Fault-v0",
        "--data.env_kwargs",
        env_kwargs,
        "--data.num_envs",
        "2",
        "--data.num_workers",
        "2",
        "--data.max_horizon",
        "8",
        "--data.steps_per_epoch",
        "1000",
        "--model.update_epochs",
        "1",
        "--model.num_minibatches",
        "2",
        "--trainer.max_steps",
        "100000",
        "--trainer.max_time",
        "null",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.default_root_dir",
        str(root),
        *extra,
    ]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("MUJOCO_GL", "egl")
    return env


def start(root: Path, *extra: str, **kw) -> tuple[subprocess.Popen, Path]:
    log = root.parent / f"{root.name}.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            command(root, *extra, **kw), stdout=f, stderr=subprocess.STDOUT, env=child_env()
        )
    return proc, log


def wait_for_training(proc: subprocess.Popen, root: Path, timeout: float = 240.0) -> None:
    """Until the first updates are logged (metrics.csv has rows), i.e. rollouts are flowing."""
    metrics = root / "csv" / "version_0" / "metrics.csv"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended early with {proc.returncode}"
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
            return
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("no training step within the timeout")


def stop_with(proc: subprocess.Popen, signum: int) -> tuple[int, float, set[int]]:
    children = descendants(proc.pid)
    t0 = time.monotonic()
    proc.send_signal(signum)
    rc = proc.wait(timeout=120)
    return rc, time.monotonic() - t0, children


def assert_no_orphans(children: set[int]) -> None:
    deadline = time.monotonic() + 10
    while any(alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [c for c in children if alive(c)], "a child process survived the trainer"


def last_line(log: Path) -> str:
    return [line for line in log.read_text().splitlines() if line.startswith("fastlight:")][-1]


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_exits_with_its_code_and_resumes(tmp_path, signum):
    root = tmp_path / "run"
    proc, log = start(root)
    wait_for_training(proc, root)
    rc, seconds, children = stop_with(proc, signum)
    assert len(children) >= 2  # the two samplers were there to be checked
    assert rc == 128 + signum, log.read_text()[-3000:]
    assert seconds < 30, seconds
    ckpt_path = root / "checkpoints" / "last.ckpt"
    line = last_line(log)
    assert line.startswith(f"fastlight: stopped by {signal.Signals(signum).name} at global step ")
    assert f"checkpoint saved to {ckpt_path} (resume with --ckpt_path {ckpt_path})" in line
    assert "Traceback" not in log.read_text()  # neither the trainer's nor a sampler's
    assert_no_orphans(children)
    ckpt = torch.load(ckpt_path, weights_only=False)
    step = ckpt["global_step"]
    assert step > 0 and step % 2 == 0 and f"global step {step};" in line  # whole updates only
    # Resume: 2 more updates, with a learning rate typed now.
    done = subprocess.run(
        command(
            root, "--ckpt_path", str(ckpt_path), "--trainer.max_steps", str(step + 4), "--model.lr", "0.01"
        ),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(yours apply): --model.lr 0.01 (checkpoint: 0.0005)" in done.stderr
    resumed = torch.load(ckpt_path, weights_only=False)
    assert resumed["global_step"] == step + 4
    assert resumed["optimizer_states"][0]["param_groups"][0]["lr"] == 0.01


@pytest.mark.slow
@pytest.mark.multiproc
def test_nan_reward_stops_the_run_naming_the_env_with_a_checkpoint(tmp_path):
    root = tmp_path / "run"
    # Each sampler has one env, whose 5-step episodes are its cycles: the NaN reward comes at the
    # last step of its 6th episode.
    proc, log = start(root, env_kwargs='{"nan_reward_at": 30}')
    children = set()
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 240:
        children |= descendants(proc.pid)
        time.sleep(0.2)
    rc = proc.wait(timeout=10)
    text = log.read_text()
    assert rc == 1, text[-3000:]
    assert "env Fault-v0 (index 0 of this sampler, seed " in text  # sampler 0 or 1 (seed 0 / 1000)
    assert "returned a non-finite reward at episode step 5: nan" in text
    assert "crashed" in text  # the SamplerError names the sampler worker
    line = last_line(log)
    assert line.startswith("fastlight: stopped by SamplerError at global step ")
    # One line that names the fix, no traceback (it is kept beside the checkpoint).
    assert "(--data.nonfinite drop drops such episodes instead)" in line
    assert line.endswith(f"; traceback in {root / 'checkpoints' / 'version_0' / 'traceback.txt'}")
    assert (
        "Traceback" not in text
        and "NonFiniteError" in (root / "checkpoints" / "version_0" / "traceback.txt").read_text()
    )
    assert_no_orphans(children)
    ckpt = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)
    weights = [v for k, v in ckpt["state_dict"].items() if k.startswith("policy.")]
    assert all(torch.isfinite(w).all() for w in weights)  # the NaN never reached an update


def test_impossible_minibatch_count_is_refused_before_training(tmp_path, capsys, monkeypatch):
    """Found as the fit starts (the DataModule's setup), nothing written: the command's one line, no stop
    line repeating it (tests/faults/test_preemption.py: the stop line without the command)."""
    args = command(tmp_path / "run", "--model.num_minibatches", "1000")[3:]
    monkeypatch.setattr(sys, "argv", ["fastlight", *args])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("fastlight: ")]
    assert len(said) == 1, said
    assert said[0].startswith("fastlight: error: --model.num_minibatches must be <= 32, "), said
    assert not (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
