"""`fastlight` CLI: every config and callback fragment parses and runs one tiny step."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

from fastlight.cli import cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))
FRAGMENTS = sorted(glob.glob(os.path.join(ROOT, "callbacks", "*.yaml")))

#: Shrinks any config to a one-step smoke run (keys every RolloutDataModule accepts).
TINY = [
    "--trainer.max_steps",
    "1",
    "--data.num_workers",
    "1",
    "--data.steps_per_epoch",
    "1",
    "--trainer.enable_progress_bar",
    "false",
]


def tiny_overrides(config: str) -> list[str]:
    return TINY + ["--data.num_envs", "2", "--data.max_horizon", "5"]


@pytest.mark.multiproc
@pytest.mark.parametrize("config", CONFIGS, ids=os.path.basename)
def test_config_runs_one_step(config, tmp_path):
    cli = cli_main(
        ["fit", "--config", config, *tiny_overrides(config), "--trainer.default_root_dir", str(tmp_path)]
    )
    assert cli.trainer.global_step >= 1
    assert cli.model.policy_version == 1
    # Sizes were linked from the data module, not written in the config.
    assert cli.model.hparams.obs_dim == cli.datamodule.obs_dim
    assert os.listdir(tmp_path)  # logs / checkpoints went under the root dir


@pytest.mark.multiproc
@pytest.mark.parametrize("fragment", FRAGMENTS, ids=os.path.basename)
def test_callback_fragment_attaches(fragment, tmp_path):
    import yaml

    wanted = [
        c["class_path"].rsplit(".", 1)[1] for c in yaml.safe_load(open(fragment))["trainer"]["callbacks+"]
    ]
    # A base config that attaches no callbacks of its own (highway_dpsa.yaml already has a
    # ThroughputMonitor, and Lightning refuses two callbacks with the same state key).
    config = os.path.join(ROOT, "examples", "merge.yaml")
    cli = cli_main(
        [
            "fit",
            "--config",
            config,
            "--config",
            fragment,
            *tiny_overrides(config),
            "--trainer.default_root_dir",
            str(tmp_path),
        ]
    )
    names = [type(c).__name__ for c in cli.trainer.callbacks]
    for name in wanted:
        assert name in names


def test_print_config_shows_the_full_config():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastlight.cli",
            "fit",
            "--config",
            os.path.join(ROOT, "configs", "highway_dpsa.yaml"),
            "--print_config",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for key in (
        "termination_threshold: 0.5",
        "reset_mode: dpsa",
        "class_path: fastlight.modules.rl_module.RLModule",
        "gae_lambda: 0.95",
        "max_staleness: 0",
    ):
        assert key in out.stdout, key


def test_cli_error_names_the_flag():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastlight.cli",
            "fit",
            "--config",
            os.path.join(ROOT, "configs", "highway_dpsa.yaml"),
            "--data.termination_threshold",
            "1.5",
            "--trainer.max_steps",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode != 0
    assert "--data.termination_threshold must be in [0, 1], got 1.5" in out.stderr
