"""The head start: samplers planned from the command line before Lightning loads, taken over by
the DataModule only when they are the ones it would start."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time

import pytest
import torch

from fastlight.data import head_start
from fastlight.data.datamodule import RolloutDataModule
from fastlight.models.mlp import MLPActorCritic
from fastlight.modules.rl_module import RLModule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "highway_dpsa.yaml")
ADOPTED = "fastlight: sampling since start-up (head start): version 0 checked equal"


def _defaults(cls: type) -> dict:
    return {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()}


def test_the_planned_defaults_are_the_classes_own() -> None:
    data, model = _defaults(RolloutDataModule), _defaults(RLModule)
    assert head_start.DATA_DEFAULTS == {k: data[k] for k in head_start.DATA_DEFAULTS}
    assert head_start.MODEL_DEFAULTS == {k: model[k] for k in head_start.MODEL_DEFAULTS}
    # Every setting the samplers' plan reads is planned or must be absent.
    assert set(data) - {"self", *head_start.DATA_DEFAULTS, *head_start.DATA_UNPLANNED} == {
        "prefetch", "trainer_threads", "steps_per_epoch",
    }  # fmt: skip


def test_plan_reads_the_shipped_config_and_refuses_what_it_cannot_plan(tmp_path, monkeypatch) -> None:
    for var in head_start.RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(head_start, "_cuda_available", lambda: False)
    planned = head_start.plan(["--config", CONFIG])
    assert not isinstance(planned, str), planned
    data, model, seed = planned
    assert (data["num_envs"], data["num_workers"], data["cycles_per_step"], data["truncation_scope"]) == (
        8, 2, 2, "auto",
    )  # fmt: skip
    assert data["max_staleness"] == 0 and model["hidden_sizes"] == (64, 64) and seed == 0
    refused = {
        "--ckpt_path=x.ckpt": "--ckpt_path",
        "--model.init_from=last.ckpt": "--model.init_from set",
        "--data.inference={}": "--data.inference set",
        "--data.head_start=false": "--data.head_start false",
        "--data.start_method=spawn": "--data.start_method spawn",
        "--seed_everything=true": "the seed is not an integer (True)",
        "--model=fastlight.VLAModule": "--model 'fastlight.VLAModule' is not one of",
    }
    for flag, reason in refused.items():
        why = head_start.plan(["--config", CONFIG, flag])
        assert isinstance(why, str) and reason in why, (flag, why)
    assert "seed is not an integer" in head_start.plan(["--config", CONFIG, "--seed_everything=null"])
    assert head_start.plan(["--config", CONFIG, "--seed_everything=null", "--data.seed=5"])[2] == 5
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert head_start.plan(["--config", CONFIG]) == "LOCAL_RANK=1"
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setattr(head_start, "_cuda_available", lambda: True)
    assert "with a GPU" in head_start.plan(["--config", CONFIG])
    assert not isinstance(head_start.plan(["--config", CONFIG, "--trainer.accelerator=cpu"]), str)


def test_policy_mismatch_finds_any_difference() -> None:
    torch.manual_seed(0)
    a = MLPActorCritic(4, 2)
    torch.manual_seed(0)
    b = MLPActorCritic(4, 2)
    assert head_start.policy_mismatch(a, b) is None
    with torch.no_grad():
        next(b.parameters()).view(-1)[3] += 1e-7  # one value, one ulp-sized step
    assert "version-0 weights differ" in head_start.policy_mismatch(a, b)
    assert "weights differ" in head_start.policy_mismatch(a, MLPActorCritic(4, 2))
    assert "policy tensors differ" in head_start.policy_mismatch(a, MLPActorCritic(4, 2, hidden_sizes=(64,)))
    assert head_start.policy_mismatch(a, torch.nn.Linear(4, 2)) == "policy MLPActorCritic vs Linear"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="confining needs two cores")
def test_confine_keeps_processes_off_one_core_and_set_cores_gives_it_back() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        cores = set(os.sched_getaffinity(0))
        assert head_start.confine([proc.pid]) == cores
        assert os.sched_getaffinity(proc.pid) == cores - {min(cores)}
        head_start.set_cores([proc.pid], cores)
        assert os.sched_getaffinity(proc.pid) == cores
    finally:
        proc.kill()
        proc.wait()
    head_start.set_cores([proc.pid], cores)  # an exited process is skipped, not an error


def _fit(tmp_path, *extra: str) -> str:
    env = dict(os.environ, MUJOCO_GL="egl")
    for var in head_start.RANK_VARS:
        env.pop(var, None)
    args = [
        sys.executable, "-m", "fastlight", "fit", *extra, "--trainer.max_steps=16",
        f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false",
        "--trainer.accelerator=cpu", "--trainer.logger=false",
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=16` reached" in out, out[-3000:]
    assert time.monotonic() - t0 < 240
    return out


def test_fit_takes_over_the_head_start_when_it_matches(tmp_path) -> None:
    out = _fit(tmp_path, "--config", CONFIG)
    assert ADOPTED in out
    assert "head start's samplers were stopped" not in out


def test_fit_stops_a_head_start_that_guessed_wrong_and_trains_with_its_own(tmp_path) -> None:
    # A flag before a config that sets it too is overridden by it (the CLI applies them in order):
    # the head start reads the flag (4 envs), the run has the second config's 8.
    again = tmp_path / "eight.yaml"
    again.write_text("data:\n  init_args:\n    num_envs: 8\n")
    out = _fit(tmp_path, "--config", CONFIG, "--data.num_envs=4", "--config", str(again))
    assert "fastlight: the head start's samplers were stopped (sampler settings differ)" in out
    assert ADOPTED not in out
