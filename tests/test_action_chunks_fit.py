"""``fastlight fit`` of the Meta-World reach VLA (its 64x64 image mode) with action chunks of 4: the
logs count env steps."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FASTLIGHT = Path(sys.executable).parent / "fastlight"


def logged(path: Path) -> list[dict[str, float]]:
    """metrics.csv as one dict per training step (Lightning writes a step's metrics over several rows)."""
    steps: dict[int, dict[str, float]] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            values = {k: float(v) for k, v in row.items() if v not in ("", None)}
            steps.setdefault(int(values["step"]), {}).update(values)
    return [steps[k] for k in sorted(steps)]


@pytest.mark.slow  # a fit run (30 s); the unit tests against naive loops are in the default suite
def test_fit_with_action_chunks_counts_env_steps(tmp_path):
    args = [
        str(FASTLIGHT), "fit", "--config", "configs/vla_metaworld_reach.yaml",
        "--model.policy.init_args.action_chunk", "4", "--trainer.max_steps", "2", "--data.num_envs", "2",
        "--data.num_workers", "1", "--data.max_horizon", "12", "--data.env_kwargs.max_path_length", "12",
        "--model.num_minibatches", "1", "--model.update_epochs", "1",
        "--trainer.default_root_dir", str(tmp_path), "--data.start_method", "spawn",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "FASTLIGHT_DEBUG"}
    run = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    steps = logged(tmp_path / "csv" / "version_0" / "metrics.csv")
    updates = [s for s in steps if "rollout/policy_steps" in s]
    assert len(updates) == 2
    for s in updates:
        # 2 envs x 12 env steps (the time limit, in 3 chunks of 4) per rollout: env steps, not chunks.
        assert (s["rollout/valid_steps"], s["rollout/policy_steps"]) == (24.0, 6.0)
    env_steps = [s["env_steps"] for s in steps if "env_steps" in s]
    assert env_steps == [24.0, 48.0]
    assert max(s.get("perf/valid_steps_total", 0.0) for s in steps) == 48.0
