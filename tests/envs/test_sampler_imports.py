"""A process that only steps Meta-World envs imports none of the VLA's stack (issue 41: an MT10
sampler <= 500 MB): not ``transformers`` (the instructions are encoded with ``tokenizers`` alone),
and with the MT10 config's inference worker no policy copy, so no ``peft``, ``accelerate`` or
``sympy`` either. scipy is Meta-World's own import (``scipy.spatial.transform`` in its envs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.envs.import_probe import HEAVY

ROOT = Path(__file__).resolve().parents[2]

#: A fresh interpreter makes the MT10 env as configs/vla_metaworld_mt10.yaml does, resets and steps
#: it, reads what a sampler reads of it, and prints the HEAVY modules it imported; then decodes the
#: instruction ids back to the sentence with the bare tokenizer (still no transformers).
STEP_MT10 = f"""
import json, sys
import gymnasium as gym
import fastlight.envs.metaworld
env = gym.make("fastlight/MetaWorld-v0", tasks="MT10", image=False, max_path_length=150,
               reward="dense_success", reward_scale=0.01)
obs, _ = env.reset(seed=0)
for task in range(10):
    env.reset(options={{"task_id": task}})
    for _ in range(3):
        obs, *_ = env.step(env.action_space.sample())
table = env.unwrapped.instruction_table
heavy = {HEAVY!r}
before = [m for m in heavy if m in sys.modules]
from fastlight.envs.instructions import instruction_words
decoded = instruction_words().decode(table.ids[0].tolist(), skip_special_tokens=True)
print(json.dumps({{"before": before, "after": "transformers" in sys.modules, "decoded": decoded,
                  "ids": obs["instruction_ids"].tolist()}}))
"""


def test_stepping_mt10_envs_imports_no_transformers():
    done = subprocess.run(
        [sys.executable, "-c", STEP_MT10], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["before"] == []
    assert not out["after"] and out["decoded"] == "reach the goal position with the gripper"
    assert out["ids"] == [2, 11, 3, 12, 6] + [0] * 11  # the last task, window-close, as before


@pytest.mark.multiproc
def test_mt10_config_samplers_import_no_transformers(tmp_path):
    """The MT10 config run by the ``fastlight`` command, for one tiny update: its samplers (forked from
    the forkserver it warms for the run's env, as in every run; this session's forkserver preloads
    highway-env instead) import none of the VLA's stack."""
    probe = tmp_path / "probe"
    probe.mkdir()
    wrapper = json.dumps(
        [{"class_path": "tests.envs.import_probe.ImportProbe", "init_args": {"dir": str(probe)}}]
    )
    cmd = [
        sys.executable, "-m", "fastlight", "fit", "--config", "configs/vla_metaworld_mt10.yaml",
        "--model.init_from", "null", "--data.num_envs", "2", "--data.max_horizon", "5",
        "--data.env_kwargs.max_path_length", "5", "--trainer.max_steps", "1",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path / "run"),
        f"--data.env_wrappers={wrapper}",
    ]  # fmt: skip
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as run:
        output, _ = run.communicate(timeout=600)
    assert run.returncode == 0, output[-4000:]
    assert "inference worker" in output  # the config's: the samplers hold no policy
    logs = {int(p.stem): json.loads(p.read_text()) for p in probe.glob("*.json")}
    trainer = logs.pop(run.pid)  # its probe env (the sizes linked to the policy) resets once
    assert "transformers" in trainer["heavy"]  # the process that holds the VLA: the probe sees it
    assert len(logs) == 2, logs  # the config's two samplers
    assert {pid: log["heavy"] for pid, log in logs.items()} == dict.fromkeys(logs, [])
