"""Exact resume: "N updates, stop, resume, M more" equals "N + M straight" bit for bit (same machine,
same kernels: both runs compute the same shapes in the same order), for both shipped configs with
``--data.max_staleness 0``; and the resume line says when a resume is not exact."""

from __future__ import annotations

import logging
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastlight.data.exact_resume import not_exact
from fastlight.sampling.exact import SamplerState, env_state, reset_seed, restore_env

ROOT = Path(__file__).resolve().parents[2]

#: Small versions of the shipped configs: what differs is sizes, never a setting that decides
#: exactness (rank_rounds apart: together cuts rounds by the samplers' relative speed).
CONFIGS = {
    "highway_dpsa": [
        "--data.num_envs", "4", "--data.max_horizon", "12", "--data.cycles_per_step", "1",
        "--data.rank_rounds", "apart", "--model.update_epochs", "2", "--model.num_minibatches", "2",
    ],
    "mujoco_ppo": [
        "--data.num_envs", "4", "--data.rollout_steps", "24", "--model.update_epochs", "2",
        "--model.num_minibatches", "4", "--data.exact_resume", "true",
    ],
}  # fmt: skip
#: Lightning counts optimizer steps: update_epochs x num_minibatches per update.
STEPS_PER_UPDATE = {"highway_dpsa": 4, "mujoco_ppo": 8}


def _fit(name: str, root: Path, updates: int, *extra: str):
    from fastlight.cli import cli_main

    args = [
        "fit", "--config", str(ROOT / "configs" / f"{name}.yaml"), *CONFIGS[name],
        "--trainer.max_steps", str(updates * STEPS_PER_UPDATE[name]), "--trainer.max_time", "null",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root),
        "--data.steps_per_epoch", "100", *extra,
    ]  # fmt: skip
    return cli_main(args)


@pytest.mark.multiproc
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_stop_and_resume_equals_straight(tmp_path, caplog, name):
    straight = _fit(name, tmp_path / "straight", 4)
    _fit(name, tmp_path / "resumed", 2)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        resumed = _fit(name, tmp_path / "resumed", 4, "--ckpt_path", "last")
    assert "fastlight: resumed as an exact continuation" in caplog.text
    assert straight.model.policy_version == resumed.model.policy_version == 4
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # and the run did learn something in its last two updates (equal because both moved the same way)
    first = torch.load(tmp_path / "resumed" / "checkpoints" / "version_0" / "last.ckpt", weights_only=False)
    moved = [k for k, v in first["state_dict"].items() if v.is_floating_point() and not torch.equal(v, a[k])]
    assert moved


def test_the_resume_line_names_every_reason_it_is_not_exact():
    hp = {"max_staleness": 1, "inference": {}, "num_workers": 2, "env_id": "Odd-v0", "exact_resume": True}
    states = {0: SamplerState(3, 3, 3), 1: SamplerState(3, 3, 3, exact=False)}
    why = not_exact(hp, states, saved_ranks=2, ranks=1, rank_rounds="together", local=False)
    assert why == [
        "it was saved by 2 trainer rank(s), this run has 1",
        "--data.max_staleness 1: rounds begin while updates land",
        "--data.rank_rounds together: the samplers end their rounds by each other's progress "
        "(apart is exact)",
        "--data.fleet: samplers on a Ray cluster",
        "--data.inference: one worker answers the samplers in the order they ask",
        "the state of Odd-v0 cannot be saved (samplers [1]), so the episodes under way start anew",
    ]
    plain = hp | {"max_staleness": 0, "inference": None, "exact_resume": False}
    assert not_exact(plain, states, saved_ranks=1, ranks=1, rank_rounds="apart", local=True) == [
        "--data.exact_resume false: the envs were not saved, so the episodes under way (autoreset runs them "
        "on across rounds) start anew"
    ]  # fmt: skip
    hp = {
        "max_staleness": 0,
        "inference": None,
        "num_workers": 2,
        "env_id": "Hopper-v4",
        "exact_resume": False,
    }
    assert (
        not_exact(hp, {0: states[0], 1: states[0]}, saved_ranks=1, ranks=1, rank_rounds="apart", local=True)
        == []
    )
    assert not_exact(hp, {}, saved_ranks=None, ranks=1, rank_rounds="apart", local=True) == [
        "the checkpoint holds no RNG states or sampler positions (written by an older fastlight)"
    ]


def _steps(env: gym.Env, actions: np.ndarray) -> list[np.ndarray]:
    out = []
    for a in actions:
        obs, _, term, trunc, _ = env.step(a)
        out.append(obs)
        if term or trunc:
            out.append(env.reset()[0])  # continues the env's own RNG, which the state holds
    return out


@pytest.mark.parametrize("env_id", ["Hopper-v4", "highway-fast-v0"])
def test_a_saved_env_goes_on_as_the_original(env_id):
    """MuJoCo: the simulator's integration state, RNG and TimeLimit count; others: pickled whole."""
    import highway_env  # noqa: F401  (registers highway-fast-v0)

    env, twin = gym.make(env_id), gym.make(env_id)
    env.reset(seed=3)
    twin.reset(seed=99)  # a different episode, overwritten by the restore
    # Hopper falls within ~100 steps: its episodes end and reset inside the 150
    actions = [env.action_space.sample() for _ in range(150 if env_id == "Hopper-v4" else 5)]
    _steps(env, actions[:17])
    state = env_state(env)
    assert state is not None
    twin = restore_env(twin, state)
    rest = actions[17:]
    for x, y in zip(_steps(env, rest), _steps(twin, rest), strict=True):
        np.testing.assert_array_equal(x, y)  # the same simulator code on the same values


def test_an_env_that_pickles_by_its_arguments_has_no_state():
    env = gym.make("CartPole-v1")  # classic control: EzPickle-free, so it pickles whole
    env.reset(seed=0)
    assert env_state(env) is not None
    from gymnasium.envs.mujoco.hopper_v4 import HopperEnv

    class NotMujoco(HopperEnv):  # an EzPickle env whose simulator is not where MuJoCo's is
        pass

    odd = NotMujoco()
    odd.reset(seed=0)
    del odd.__dict__["data"]
    assert env_state(odd) is None


def test_reset_seeds_first_then_drawn():
    assert [reset_seed(1000, 0, i) for i in range(3)] == [1000, 1001, 1002]  # what an env error names
    later = [reset_seed(1000, n, i) for n in (1, 2) for i in range(3)]
    assert len(set(later)) == 6 and later == [reset_seed(1000, n, i) for n in (1, 2) for i in range(3)]
