"""The sampling benchmark on the real path (RolloutDataModule sampler processes): its random policy
over any action space, and a tiny table for a discrete- and a Box-action env."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from benchmarks.sampling.__main__ import main
from benchmarks.sampling.procs import FixedPolicy, SpaceRandomPolicy
from fastlight.data.protocols import TrainsPolicy
from fastlight.sampling.obs import action_to_env


def test_random_policy_samples_a_discrete_space() -> None:
    policy = SpaceRandomPolicy(gym.spaces.Discrete(3, start=2))
    torch.manual_seed(0)
    out = policy.act(torch.zeros(3000, 4))
    counts = torch.bincount(out.actions - 2, minlength=3).float() / 3000
    torch.testing.assert_close(counts, torch.full((3,), 1 / 3), atol=0.03, rtol=0)  # 6 s.e.
    assert int(out.actions.min()) == 2 and int(out.actions.max()) == 4
    torch.testing.assert_close(out.logprobs, torch.full((3000,), -math.log(3)))
    assert all(isinstance(a, int) for a in action_to_env(policy, out.actions))


def test_random_policy_samples_a_box_space_over_dict_observations() -> None:
    space = gym.spaces.Box(low=np.array([-2.0, 0.0, -np.inf]), high=np.array([2.0, 0.5, np.inf]))
    policy = SpaceRandomPolicy(space)
    obs = {"image": torch.zeros(5000, 2, 2), "proprio": torch.zeros(5000, 3)}
    a = policy.act(obs).actions
    assert a.shape == (5000, 3)
    assert space.contains(a[0].numpy().astype(np.float32))
    assert float(a[:, 0].min()) >= -2.0 and float(a[:, 0].max()) <= 2.0
    assert float(a[:, 1].min()) >= 0.0 and float(a[:, 1].max()) <= 0.5
    torch.testing.assert_close(a[:, 0].mean(), torch.tensor(0.0), atol=0.1, rtol=0)  # s.e. 0.016
    torch.testing.assert_close(a[:, 2].std(), torch.tensor(1.0), atol=0.05, rtol=0)  # unbounded: N(0, 1)
    # Log-density of the bounded axes: -log(4 * 0.5).
    torch.testing.assert_close(policy.act(obs).logprobs[0], torch.tensor(-math.log(2.0)))
    assert torch.equal(policy.value(obs), torch.zeros(5000))


def test_fixed_policy_is_what_the_datamodule_samples_with() -> None:
    assert isinstance(FixedPolicy(SpaceRandomPolicy(gym.spaces.Discrete(2))), TrainsPolicy)


def test_bad_input_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--env must be a registered gymnasium id"):
        main(["--env", "NoSuchEnv-v9", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--settings shared_sim .* --path single"):
        main(["--env", "CartPole-v1", "--settings", "shared_sim", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--clips must all be >= 1"):
        main(["--env", "CartPole-v1", "--clips", "0", "--out", str(tmp_path)])


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_real_path_table(env_id: str, tmp_path: Path) -> None:
    """Sampler processes for every cell; one round of a few batches each, so this takes ~1 min."""
    rows = main(
        [
            "--env",
            env_id,
            "--clips",
            "2",
            "--thresholds",
            "1.0",
            "--valid-steps",
            "30",
            "--rounds",
            "1",
            "--settings",
            "native",
            "--workers",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert [(r["mode"], r["clips"]) for r in rows] == [
        ("sequential", 1),
        ("sgr", 2),
        ("autoreset", 2),
        ("dpsa", 2),
    ]
    for r in rows:
        assert r["path"] == "procs" and r["valid_steps"] >= 30
        assert r["workers"] == (1 if r["mode"] == "sequential" else 2)
        assert r["effective_tps"] > 0 and 0 < r["time_efficiency"] <= 1
        assert 0 < r["sample_efficiency"] <= 1
        torch.testing.assert_close(r["effective_tps"], r["raw_tps"] * r["sample_efficiency"])
        # Busy sampler time can never exceed processes x wall clock.
        assert r["wall_s"] <= r["workers"] * r["elapsed_s"] * 1.001
    assert rows[0]["speedup_vs_sequential"] == 1.0
    if env_id == "Pendulum-v1":  # no termination: only 200-step time limits, never a cut before
        assert all(r["sample_efficiency"] == 1.0 for r in rows)
    md = (tmp_path / "sampling.md").read_text()
    assert "Path: `procs`" in md and "| procs | busy |" in md
    assert len(json.loads((tmp_path / "sampling.json").read_text())) == 4
