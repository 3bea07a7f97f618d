"""Learning check (slow): PPO + SMPO with DPSA beats a random policy on highway-fast-v0.

Run with ``make test-slow``. Trains the main config for a few minutes, then plays the same 20
evaluation seeds with the trained and a uniform-random policy. The command itself (where it
writes, which checkpoints it loads) is checked on the tiny run of the ``highway_run`` fixture.
"""

from __future__ import annotations

import glob
import json
import os

import pytest

from benchmarks.learning import compare
from fastlight.cli import cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_trained_policy_beats_random_by_a_clear_margin(tmp_path):
    cli_main(["fit", "--config", os.path.join(ROOT, "configs", "highway_dpsa.yaml"),
              "--trainer.max_time", "00:00:06:00", "--trainer.enable_progress_bar", "false",
              "--trainer.default_root_dir", str(tmp_path)])  # fmt: skip
    # The CLI keeps checkpoints at <root>/checkpoints (not under a logger's version folder).
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert ckpt.is_file(), sorted(glob.glob(str(tmp_path / "**" / "*.ckpt"), recursive=True))
    result = compare(str(ckpt), env_id="highway-fast-v0", episodes=20, seed=10_000, deterministic=False)
    trained, rand = result["trained"], result["random"]
    # A clear margin: the CIs do not overlap and the mean is at least 1.5x the random one.
    assert trained["ci_low"] > rand["ci_high"], result
    assert trained["mean"] > 1.5 * rand["mean"], result
    assert trained["crash_rate"] < rand["crash_rate"], result


def test_subclass_checkpoint_is_checked_beside_itself(highway_run):
    """A module subclass's checkpoint loads, and without --out the report goes to a folder beside
    the checkpoint: the published benchmarks/results/main_job.md is never overwritten by default."""
    from benchmarks.learning import main

    published = os.path.join(ROOT, "benchmarks", "results", "main_job.md")
    before = open(published).read()
    ckpt = highway_run / "checkpoints" / "last.ckpt"
    result = main(["--ckpt", str(ckpt), "--episodes", "2"])
    assert open(published).read() == before
    folder = highway_run / "checkpoints" / "last_learning"
    written = json.loads((folder / "main_job.json").read_text())
    assert written["trained"] == result["trained"] and written["trained"]["n"] == 2
    assert result["env_id"] == "highway-fast-v0"  # from the checkpoint
    assert result["policy_version"] == 2  # the subclass's trained weights, not a fresh module
    text = (folder / "main_job.md").read_text()
    assert f"--ckpt {ckpt} --out {folder}" in text  # the command reproduces this very file
