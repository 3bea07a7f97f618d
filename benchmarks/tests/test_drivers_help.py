"""Every benchmark driver answers ``python -m benchmarks.<name> --help`` (run in-process, as ``-m`` does),
and a driver's child ``python -m benchmarks.<module>`` finds the package from any working directory."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from benchmarks import REPO_ROOT, child_env

ROOT = Path(__file__).resolve().parents[2]

#: The command-line drivers; the run-file workers (convergence.worker / .sb3, a ``run.json`` each,
#: started by ``benchmarks.convergence``) and sync.report (a results file) take no flags.
DRIVERS = (
    "benchmarks.chaos",
    "benchmarks.convergence",
    "benchmarks.driving",
    "benchmarks.faults",
    "benchmarks.fleet",
    "benchmarks.fleet_weights",
    "benchmarks.gpu_check",
    "benchmarks.learning",
    "benchmarks.mujoco",
    "benchmarks.multinode",
    "benchmarks.objectives",
    "benchmarks.objectives.run",
    "benchmarks.objectives.throughput",
    "benchmarks.overhead",
    "benchmarks.pruning",
    "benchmarks.rollback_cost",
    "benchmarks.sampler_memory",
    "benchmarks.sampling",
    "benchmarks.sampling.auto_threshold",
    "benchmarks.sampling.model",
    "benchmarks.sharded_save",
    "benchmarks.soak",
    "benchmarks.startup",
    "benchmarks.sync",
    "benchmarks.sync.lag",
    "benchmarks.sync.lora",
    "benchmarks.vla.ablation",
    "benchmarks.vla.bc_baseline",
    "benchmarks.vla.eval",
    "benchmarks.vla.flow_cost",
    "benchmarks.vla.group_outcomes",
    "benchmarks.vla.hf_throughput",
    "benchmarks.vla.image_split",
    "benchmarks.vla.mt10_memory",
    "benchmarks.vla.mt10_report",
    "benchmarks.vla.policy_shift",
)
NO_FLAGS = {"benchmarks.convergence.worker", "benchmarks.convergence.sb3", "benchmarks.sync.report"}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__main__" else parts)


def test_the_driver_list_is_every_module_with_a_main_guard():
    found = {
        _module(p)
        for p in (ROOT / "benchmarks").rglob("*.py")
        if "tests" not in p.parts and re.search(r'^if __name__ == "__main__":', p.read_text(), re.M)
    }
    assert found - NO_FLAGS == set(DRIVERS)
    assert NO_FLAGS <= found


@pytest.mark.parametrize("name", DRIVERS)
def test_help_exits_0_and_prints_usage(name, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with warnings.catch_warnings():
        # runpy re-runs a module a test already imported; that is what `python -m` would run too.
        warnings.filterwarnings("ignore", category=RuntimeWarning, message=".*found in sys.modules.*")
        with pytest.raises(SystemExit) as info:
            runpy.run_module(name, run_name="__main__", alter_sys=True)
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: "), out[:200]


def test_child_processes_find_the_uninstalled_package_from_any_directory(tmp_path):
    assert REPO_ROOT == ROOT
    probe = [sys.executable, "-c", "import benchmarks, sys; print(benchmarks.REPO_ROOT)"]
    env = child_env(OMP_NUM_THREADS="1")
    assert env["OMP_NUM_THREADS"] == "1" and env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    done = subprocess.run(probe, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(ROOT)
