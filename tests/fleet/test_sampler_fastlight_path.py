"""Samplers import the fastlight the trainer runs, not a ``fastlight/`` folder in the working
directory (a checkout next to the run): ``cli_main`` appends the working directory to ``sys.path``,
which spawned and forked children inherit, and a forkserver (whose ``python -c`` puts it first)
preloads nothing there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastlight.fleet import start

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """\
import json, os, sys
from fastlight.fleet.start import warm_forkserver

if __name__ == "__main__":
    report_dir = sys.argv[1]
    assert warm_forkserver("tests.sampling.error_envs:WhichFastlight-v0")  # as the fastlight command does
    sys.path.append(os.getcwd())  # as cli_main does, for the user's own modules
    import fastlight
    from fastlight.models.mlp import MLPActorCritic
    from fastlight.fleet.faults import FaultSettings
    from fastlight.fleet.base import FleetBuild
    from fastlight.fleet.pool import SamplerPool
    from fastlight.sampling.bundle import SamplerConfig

    net = MLPActorCritic(3, 2)
    out = {"trainer": fastlight.__file__}
    for method in ("spawn", "forkserver"):
        config = SamplerConfig(env_id="tests.sampling.error_envs:WhichFastlight-v0", num_envs=1,
                               max_horizon=4, env_kwargs={"report_dir": report_dir})
        faults = FaultSettings(worker_timeout_s=60, max_worker_restarts=0)
        pool = SamplerPool(FleetBuild([config], net, faults=faults, start_method=method))
        pool.start()
        try:
            pool.publish(net, 0)
            while pool.next_item(0.5) is None:
                pass
            out[method] = pool.procs[0].pid
        finally:
            pool.stop()
    print(json.dumps(out))
"""


@pytest.mark.multiproc
def test_samplers_do_not_import_a_fastlight_folder_in_the_working_directory(tmp_path):
    work = tmp_path / "work"
    (work / "fastlight").mkdir(parents=True)
    (work / "fastlight" / "__init__.py").write_text(
        "raise RuntimeError('the fastlight/ of the working directory')\n"
    )
    (tmp_path / "bin").mkdir()
    script = (
        tmp_path / "bin" / "driver.py"
    )  # run by path, like a console script: its own folder is sys.path[0]
    script.write_text(DRIVER)
    reports = tmp_path / "reports"
    reports.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(script), str(reports)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the fastlight/ of the working directory" not in done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["trainer"] == str(ROOT / "fastlight" / "__init__.py")
    for method in ("spawn", "forkserver"):
        assert (reports / str(out[method])).read_text() == out["trainer"], method


def test_another_fastlight_in_the_working_directory_is_told_from_this_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not start.cwd_holds_another_fastlight()  # none there
    (tmp_path / "fastlight").mkdir()
    assert not start.cwd_holds_another_fastlight()  # a folder that is no package
    (tmp_path / "fastlight" / "__init__.py").write_text("")
    assert start.cwd_holds_another_fastlight()
    monkeypatch.chdir(ROOT)
    assert Path(start.PACKAGE_DIR) == ROOT / "fastlight" and not start.cwd_holds_another_fastlight()
