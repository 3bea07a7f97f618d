"""Joining a Ray cluster: one with authentication disabled is refused in one line unless
``allow_unauthenticated`` says otherwise, and one the trainer has no valid token for (none, another, or
token mode off) is refused in one line within seconds, without Ray's warning a second.

The clusters are this module's own, started with the ``ray`` command as the README says (loopback,
no dashboard, a home folder and Ray temp dir of their own, a free port) and stopped by pid in a
``finally`` (``ray stop`` would stop every Ray process of the user on this machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastlight.fleet.ray.cluster import RayCluster
from fastlight.fleet.ray.fleet import RayFleet
from tests.fleet.ray.test_ray_readme import BIN, cluster_processes, free_port, stop_processes

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
ray = pytest.importorskip("ray")


def start_head(mode: str) -> tuple[Path, str]:
    """A one-node cluster with ``RAY_AUTH_MODE=mode`` (a token generated for ``token``): its home folder
    and address."""
    home = Path(tempfile.mkdtemp(prefix="rayauth", dir="/tmp"))  # short: Ray's socket paths
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTEST_"))}
    env |= {"HOME": str(home), "RAY_TMPDIR": str(home), "RAY_AUTH_MODE": mode}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    script = "ray get-auth-token --generate && " if mode == "token" else ""
    script += (
        f"ray start --head --port {port} --num-cpus 1 --node-ip-address 127.0.0.1 --include-dashboard=false"
    )
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        stop(home)
        raise AssertionError(done.stdout[-2000:] + done.stderr[-2000:])
    return home, f"127.0.0.1:{port}"


def stop(home: Path) -> None:
    left = stop_processes(cluster_processes(home))
    shutil.rmtree(home, ignore_errors=True)
    assert not left, f"Ray processes left: {left}"


@pytest.fixture(scope="module")
def open_cluster() -> Iterator[str]:
    home, address = start_head("disabled")
    try:
        yield address
    finally:
        stop(home)


@pytest.fixture(scope="module")
def token_cluster() -> Iterator[tuple[str, str]]:
    home, address = start_head("token")
    try:
        yield address, (home / ".ray" / "auth_token").read_text().strip()
    finally:
        stop(home)


@pytest.fixture
def trainer_env(monkeypatch, tmp_path):
    """The trainer's environment, without any token: a home of its own, no RAY_AUTH_* (Ray's token
    loader caches what it read: cleared)."""
    from ray._raylet import AuthenticationTokenLoader

    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    AuthenticationTokenLoader.instance().reset_cache()
    yield monkeypatch
    AuthenticationTokenLoader.instance().reset_cache()


def refusal(address: str, **settings) -> tuple[str, float]:
    """The one line joining ``address`` is refused with, and how long the refusal took (s)."""
    cluster = RayCluster(RayFleet(address=address, **settings), rank=0, samplers=1)
    start = time.monotonic()
    try:
        with pytest.raises(ConnectionError) as info:
            cluster.connect()
    finally:
        cluster.close()
    assert not ray.is_initialized()
    return str(info.value), time.monotonic() - start


def test_a_cluster_with_authentication_disabled_is_refused_in_one_line_unless_allowed(
    open_cluster, trainer_env, capfd
):
    line, took = refusal(open_cluster)
    assert "\n" not in line and took < 10.0, (line, took)
    assert line.startswith(
        f"--data.fleet.init_args.address {open_cluster}: the Ray cluster there has authentication disabled "
        "(RAY_AUTH_MODE=disabled): anyone who reaches its ports can run code on its nodes;"
    ), line
    assert line.endswith("set --data.fleet.init_args.allow_unauthenticated true to join it anyway")

    # Allowed: joined, the samplers' bundle placed on it.
    cluster = RayCluster(RayFleet(address=open_cluster, allow_unauthenticated=True), rank=0, samplers=1)
    try:
        assert cluster.connect().is_initialized() and cluster.pg is not None
    finally:
        cluster.close()
    assert not ray.is_initialized()


@pytest.mark.parametrize(
    "case, expected",
    [
        ("another token", "refuses this machine's token (InvalidAuthToken): it needs RAY_AUTH_MODE=token"),
        ("no token", "needs RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH "
         "or ~/.ray/auth_token); no token was found"),
        ("token mode off", "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token); RAY_AUTH_MODE is unset"),
    ],
)  # fmt: skip
def test_a_token_cluster_without_its_token_is_refused_in_one_line_within_seconds(
    token_cluster, trainer_env, capfd, case, expected
):
    address, token = token_cluster
    if case != "token mode off":
        trainer_env.setenv("RAY_AUTH_MODE", "token")
    if case != "no token":
        trainer_env.setenv("RAY_AUTH_TOKEN", "not-the-token" if case == "another token" else token)
    capfd.readouterr()
    line, took = refusal(address)
    assert "\n" not in line and took < 10.0, (line, took)  # Ray alone: 20 s of retries, then a traceback
    assert line.startswith(f"--data.fleet.init_args.address {address}: the Ray cluster there "), line
    assert expected in line, line
    out, err = capfd.readouterr()
    assert "gcs_client" not in out + err and "InvalidAuthToken" not in out + err, err[-2000:]
