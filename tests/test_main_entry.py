"""The console script sets MuJoCo's GL backend before anything (forkserver, evaluate, plot) starts."""

from __future__ import annotations

import os
import sys

import pytest

from fastlight.__main__ import main


def test_console_script_sets_mujoco_gl_first(monkeypatch) -> None:
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.setattr(sys, "argv", ["fastlight", "plot", "--help"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 0 and os.environ["MUJOCO_GL"] == "egl"


def test_a_users_choice_of_backend_is_kept(monkeypatch) -> None:
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    monkeypatch.setattr(sys, "argv", ["fastlight", "plot", "--help"])
    with pytest.raises(SystemExit):
        main()
    assert os.environ["MUJOCO_GL"] == "osmesa"


def _group(pgid: int) -> list[int]:
    """The processes still in process group ``pgid`` (a terminal's Ctrl-C reaches all of them)."""
    from fastlight.procs import stat_fields

    return [
        int(e)
        for e in os.listdir("/proc")
        if e.isdigit() and (f := stat_fields(int(e))) and int(f[2]) == pgid
    ]


@pytest.mark.multiproc
@pytest.mark.parametrize("delay", [0.5, 3.0])  # importing Lightning; parsing and building the run
def test_ctrl_c_while_starting_is_one_line_130_and_leaves_nothing(tmp_path, delay) -> None:
    """Ctrl-C in a terminal signals the whole foreground process group: the trainer and the forkserver
    it started first. Before training, that is one line and exit 130, as during training."""
    import signal
    import subprocess
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    command = [
        sys.executable, "-m", "fastlight", "fit", "--config", str(root / "configs" / "highway_dpsa.yaml"),
        "--data.env_id", "tests.fake_envs:FixedLength-v0", "--data.env_kwargs", "{}",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    time.sleep(delay)
    assert proc.poll() is None, proc.stderr.read()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("fastlight:")]
    assert len(lines) == 1 and ("interrupted (Ctrl-C)" in lines[0] or "SIGINT" in lines[0]), err
    deadline = time.monotonic() + 10
    while _group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group(proc.pid) == [], "a process of the run outlived it"
