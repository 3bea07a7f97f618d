"""The README's Ray cluster commands as pasted: token authentication, a head and a simulator node started
with the ``ray`` command on localhost, and ``fastlight fit`` with its samplers on the simulator node; then
a run that cannot authenticate to that cluster stops with one line naming the address and the cause.

The cluster is this test's own: a home folder (``~/.ray/auth_token``) and Ray temp dir of its own, a free
port for 6379, loopback addresses and no dashboard. Its processes are stopped by pid in a ``finally``
(every process the commands started has that home folder in its environment): ``ray stop`` would stop
every Ray process of the user on this machine, other runs' too.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fastlight.procs import alive
from tests.test_cli import tiny_overrides
from tests.test_readme import COMMANDS

# About 2 minutes on 2 busy cores (two `ray start`, a fit on the cluster, a refused fit).
pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent  # the venv's ray and fastlight
#: The loopback-only, dashboard-free, quick variant of each README command (appended flags).
EXTRA = {
    "ray start --head": ["--node-ip-address", "127.0.0.1", "--include-dashboard=false"],
    "ray start --address": ["--node-ip-address", "127.0.0.1"],
    "fastlight fit": [*tiny_overrides(), "--data.num_workers", "2"],
}


def readme_ray_commands() -> list[str]:
    """The README's Ray section: from its first export to the run on the cluster."""
    start = COMMANDS.index("export RAY_AUTH_MODE=token")
    commands = COMMANDS[start : start + 5]
    assert commands[1].startswith("ray get-auth-token") and "RayFleet" in commands[4], commands
    return commands


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def processes_with_home(home: Path) -> list[int]:
    """Every process whose environment has ``HOME=<home>``: what this test's commands started."""
    marker = f"HOME={home}".encode()
    out = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                out.append(int(entry))
        except OSError:
            pass
    return out


def cluster_processes(home: Path) -> list[int]:
    """The processes of a cluster started with ``HOME=<home>``: those, and their children (Ray's agents
    rewrite what their environment reads as)."""
    from tests.fleet.ray.test_ray_fleet import _descendants

    pids = processes_with_home(home)
    return sorted({*pids, *(c for p in pids for c in _descendants(p))})


def stop_processes(pids: list[int], timeout: float = 20.0) -> list[int]:
    """SIGTERM ``pids``, then SIGKILL what is left after ``timeout``; returns those still alive."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while [p for p in pids if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
    return [p for p in pids if alive(p)]


def run(script: str, env: dict[str, str], timeout: float = 180.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_readme_ray_commands_run_as_pasted(tmp_path):
    pytest.importorskip("ray")
    # Short: Ray's socket paths under its temp dir must fit in 107 bytes.
    home = Path(tempfile.mkdtemp(prefix="rayhome", dir="/tmp"))
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTEST_"))}
    env |= {"HOME": str(home), "RAY_TMPDIR": str(home), "HEAD_ADDR": "127.0.0.1"}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    lines = ["set -e"]
    for command in readme_ray_commands():
        extra = next((flags for head, flags in EXTRA.items() if command.startswith(head)), [])
        if command.startswith("fastlight fit"):
            extra = [*extra, "--trainer.default_root_dir", str(tmp_path / "run")]
        lines.append(f"{command.replace('6379', port)} {shlex.join(extra)}".strip())
    try:
        done = run("\n".join(lines), env)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-4000:]
        assert "`Trainer.fit` stopped: `max_steps=1` reached." in output, output[-4000:]
        assert "runs on Ray node" in output and (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()

        # Another token: one line naming the address and the cause, no traceback, none of Ray's warnings.
        address = f"127.0.0.1:{port}"
        wrong = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-the-token"}
        fit = [c for c in lines if c.startswith("fastlight fit")][0].replace(
            "address auto", f"address {address}"
        )
        refused = run(f"{fit} --trainer.default_root_dir {tmp_path / 'refused'}", wrong, timeout=120)
        err = refused.stderr
        assert refused.returncode == 2 and "Traceback" not in err and "gcs_client" not in err, err[-4000:]
        errors = [x for x in err.splitlines() if x.startswith("fastlight: error:")]
        assert len(errors) == 1, err[-4000:]
        assert not [x for x in err.splitlines() if x.startswith("fastlight: stopped")], err[-4000:]
        assert errors[0].startswith(
            f"fastlight: error: --data.fleet.init_args.address {address}: the Ray cluster there refuses this "
            "machine's token (InvalidAuthToken)"
        ), errors[0]
    finally:
        left = stop_processes(cluster_processes(home))
        assert not left, f"Ray processes left: {left}"
        shutil.rmtree(home, ignore_errors=True)
