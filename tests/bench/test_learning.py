"""Learning check (slow): PPO + SMPO with DPSA beats a random policy on highway-fast-v0.

Run with ``make test-slow``. Trains the main config for a few minutes, then plays the same 20
evaluation seeds with the trained and a uniform-random policy.
"""

from __future__ import annotations

import glob
import os

import pytest

from fastlight.bench.learning import compare
from fastlight.cli import cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_trained_policy_beats_random_by_a_clear_margin(tmp_path):
    cli_main(["fit", "--config", os.path.join(ROOT, "configs", "highway_dpsa.yaml"),
              "--trainer.max_time", "00:00:06:00", "--trainer.enable_progress_bar", "false",
              "--trainer.default_root_dir", str(tmp_path)])
    ckpt = glob.glob(str(tmp_path / "tb" / "*" / "checkpoints" / "last.ckpt"))
    assert ckpt, "no last.ckpt written"
    result = compare(ckpt[0], env_id="highway-fast-v0", episodes=20, seed=10_000, deterministic=False)
    trained, rand = result["trained"], result["random"]
    # A clear margin: the CIs do not overlap and the mean is at least 1.5x the random one.
    assert trained["ci_low"] > rand["ci_high"], result
    assert trained["mean"] > 1.5 * rand["mean"], result
    assert trained["crash_rate"] < rand["crash_rate"], result
