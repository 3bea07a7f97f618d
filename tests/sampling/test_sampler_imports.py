"""A sampler process loads only what sampling needs (issue 14: start-up and memory).

Spawned children re-import the parent's main module. The parent here is a script shaped like
the ``fastlight`` console script (its one top-level import is the ``[project.scripts]`` entry),
which then starts samplers the way ``RolloutDataModule.start`` does (``SamplerPool`` over
``sampler_configs`` with a ``cpu_copy`` of an MLP policy) on a real highway-env, and holds
Lightning itself. Each sampler reports its ``sys.modules`` and memory from inside
(``tests.probe_env``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: What a sampler for an MLP policy on highway-env never needs.
HEAVY = ("lightning", "pytorch_lightning", "transformers", "metaworld", "mujoco", "torchmetrics")

#: VmRSS bound of a highway sampler. 300 MB was the target; it cannot be met with torch in the
#: process: ``import torch`` alone is ~283 MB VmRSS (CPU wheel 2.13, ~146 MB of it anonymous
#: memory), and highway-env imports pandas (its Kinematics observation) and matplotlib, ~+70 MB.
#: Before the light entry module a sampler held ~570 MB; see benchmarks/results/startup.md.
MAX_VMRSS_MB = 420

DRIVER = """\
import sys
from {entry_module} import {entry_func}  # the console script's one import, re-run by spawn in children

if __name__ == "__main__":
    import glob, json, os, time
    start_method = sys.argv[2]
    if start_method == "forkserver":  # as the fastlight command does, before Lightning is imported
        from fastlight.fleet.start import warm_forkserver
        assert warm_forkserver("tests.probe_env:ModulesProbe-v0")
    import lightning  # noqa: F401 - the trainer holds it; its children must not
    from fastlight.data.datamodule import RolloutDataModule, cpu_copy
    from fastlight.models.mlp import MLPActorCritic
    from fastlight.fleet.faults import FaultSettings
    from fastlight.fleet.base import FleetBuild
    from fastlight.fleet.pool import SamplerPool

    report_dir = sys.argv[1]
    dm = RolloutDataModule(
        env_id="tests.probe_env:ModulesProbe-v0", env_kwargs={{"report_dir": report_dir}},
        num_envs=2, num_workers=1, max_horizon=8, seed=0,
    )
    policy = MLPActorCritic(dm.obs_dim, dm.action_dim)
    policy = cpu_copy(policy).eval()
    faults = FaultSettings(worker_timeout_s=120)
    pool = SamplerPool(FleetBuild(dm.sampler_configs(0), policy, faults=faults, start_method=start_method))
    pool.start()
    try:
        pids = [p.pid for p in pool.procs]
        for version in range(3):  # resets after the policy has run, not only the first one
            pool.publish(policy, version)
            item = None
            while item is None:
                item = pool.next_item(timeout=1.0)
        parents = [int(open(f"/proc/{{p}}/stat").read().rsplit(")", 1)[1].split()[1]) for p in pids]
        print(json.dumps({{"pids": pids, "parents": parents, "trainer": os.getpid(),
                          "trainer_has_lightning": "lightning" in sys.modules}}))
    finally:
        pool.stop()
"""


def _entry() -> tuple[str, str]:
    """The ``fastlight`` console script's ``module:function`` from pyproject.toml (what pip writes
    into the script; Python 3.10 has no tomllib)."""
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        found = re.search(r'^fastlight = "([\w.]+):(\w+)"', f.read(), re.MULTILINE)
    assert found, "pyproject.toml [project.scripts] has no fastlight entry"
    return found.group(1), found.group(2)


@pytest.mark.multiproc
# The forkserver is `fastlight fit`'s default; the spawned sampler imports the same modules (slow).
@pytest.mark.parametrize("start_method", [pytest.param("spawn", marks=pytest.mark.slow), "forkserver"])
def test_highway_sampler_loads_no_lightning_transformers_or_metaworld(tmp_path, start_method):
    """Spawned, or forked from the forkserver the fastlight command warms before it imports
    Lightning: either way the sampler holds no Lightning, transformers or Meta-World."""
    module, func = _entry()
    script = tmp_path / "fastlight"  # a file named like the console script, run by path
    script.write_text(DRIVER.format(entry_module=module, entry_func=func))
    reports = tmp_path / "reports"
    reports.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(script), str(reports), start_method],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parent["trainer_has_lightning"]
    (pid,) = parent["pids"]
    forked = parent["parents"] != [parent["trainer"]]  # a forkserver child has the server as parent
    assert forked == (start_method == "forkserver")
    report = json.loads((reports / f"{pid}.json").read_text())
    modules = set(report["modules"])
    assert "highway_env" in modules and "fastlight.sampling.worker" in modules  # it did sample
    loaded = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not loaded, f"a highway MLP sampler imported {loaded[:10]}"
    assert report["VmRSS"] < MAX_VMRSS_MB, report


CONSOLE_SCRIPT = """\
import sys
from {entry_module} import {entry_func}
if __name__ == "__main__":
    sys.exit({entry_func}())
"""


@pytest.mark.slow
@pytest.mark.multiproc
def test_cli_fit_samplers_load_no_lightning(tmp_path):
    """The same through the real CLI: ``fastlight fit --config configs/highway_dpsa.yaml`` run by a
    console script as pip writes it, shrunk to one training step."""
    module, func = _entry()
    script = tmp_path / "fastlight"
    script.write_text(CONSOLE_SCRIPT.format(entry_module=module, entry_func=func))
    reports = tmp_path / "reports"
    reports.mkdir()
    args = [
        "fit",
        "--config",
        "configs/highway_dpsa.yaml",
        "--trainer.max_steps",
        "1",
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        "--trainer.enable_progress_bar",
        "false",
        "--data.num_workers",
        "1",
        "--data.num_envs",
        "2",
        "--data.max_horizon",
        "5",
        "--data.steps_per_epoch",
        "1",
        "--data.env_id",
        "tests.probe_env:ModulesProbe-v0",
        "--data.env_kwargs",
        json.dumps({"report_dir": str(reports)}),
    ]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    trainer = json.loads((reports / f"{proc.pid}.json").read_text())
    assert "lightning" in trainer["modules"]  # the probe also ran in the trainer (the env check)
    samplers = [p for p in reports.glob("*.json") if p.name != f"{proc.pid}.json"]
    assert len(samplers) == 1
    modules = json.loads(samplers[0].read_text())["modules"]
    loaded = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not loaded, f"a sampler of `fastlight fit` imported {loaded[:10]}"
