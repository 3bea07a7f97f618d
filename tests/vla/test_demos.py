"""Scripted-expert demonstrations: same observations as the RL env, cache keyed by settings, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastlight.envs.registry import make_env
from fastlight.vla.demos import DemoDataModule, DemoSettings, episode_seed, generate_task, play_expert

KW = {"tasks": "reach-v3,drawer-close-v3", "image": False, "max_path_length": 100}


def settings(**kw) -> DemoSettings:
    base = dict(
        env_id="fastlight/MetaWorld-v0",
        env_kwargs=KW,
        demos_per_task=2,
        seed=3,
        successful_only=True,
        max_attempts_per_demo=3,
    )
    return DemoSettings(**{**base, **kw})


def test_demo_observations_equal_the_rl_envs_for_the_same_seed():
    """Replaying the demo's actions in a fresh RL env (same id, kwargs, seed, task) gives the same
    observations at every step: the policy is trained on exactly what it will see."""
    demo_env = make_env("fastlight/MetaWorld-v0", env_kwargs=KW)
    obs, actions, rewards, success = play_expert(demo_env, 1, seed=episode_seed(3, 1, 0))
    demo_env.close()
    assert success and len(obs) == len(actions) == len(rewards) > 5
    rl_env = make_env("fastlight/MetaWorld-v0", env_kwargs=KW)
    got, _ = rl_env.reset(seed=episode_seed(3, 1, 0), options={"task_id": 1})
    for t, action in enumerate(actions):
        assert set(got) == set(obs[t]) == {"proprio", "instruction_ids", "instruction_mask"}
        for key in got:
            np.testing.assert_array_equal(got[key], obs[t][key], err_msg=f"step {t} key {key}")
        got, *_ = rl_env.step(action)
    rl_env.close()
    # the instruction is drawer-close's, not reach's
    assert not np.array_equal(
        obs[0]["instruction_ids"],
        make_env("fastlight/MetaWorld-v0", env_kwargs=KW).reset(seed=0, options={"task_id": 0})[0][
            "instruction_ids"
        ],
    )


def test_generate_keeps_successful_demos_and_counts_attempts():
    part = generate_task(settings(), 0)
    assert part["expert"]["kept"] == 2 and part["expert"]["successes"] >= 2
    assert part["expert"]["attempts"] >= 2
    n = len(part["actions"])
    assert part["obs"]["proprio"].shape == (n, 39) and part["actions"].shape == (n, 4)
    assert np.abs(part["actions"]).max() <= 1.0
    # steps restart at 0 for each episode, episodes are numbered 0, 1
    starts = np.flatnonzero(part["step"] == 0)
    assert list(part["episode"][starts]) == [0, 1]


def test_cache_is_reused_and_never_for_other_settings(tmp_path):
    dm = DemoDataModule(env_kwargs=KW, demos_per_task=1, seed=3, num_workers=0, cache_dir=str(tmp_path))
    demos = dm.load()
    assert demos.task_names == ("reach-v3", "drawer-close-v3") and demos.num_episodes == 2
    assert dm.cache_file.exists() and dm.cache_file.with_suffix(".json").exists()
    again = DemoDataModule(env_kwargs=KW, demos_per_task=1, seed=3, num_workers=0, cache_dir=str(tmp_path))
    mtime = dm.cache_file.stat().st_mtime_ns
    torch.testing.assert_close(again.load().actions, demos.actions, rtol=0, atol=0)
    assert dm.cache_file.stat().st_mtime_ns == mtime  # read, not regenerated
    other = DemoDataModule(env_kwargs=KW, demos_per_task=1, seed=4, num_workers=0, cache_dir=str(tmp_path))
    assert other.cache_file != dm.cache_file
    # a file planted under another settings' name is refused, naming what differs
    other.cache_file.write_bytes(dm.cache_file.read_bytes())
    with pytest.raises(ValueError, match="other settings.*seed"):
        other.load()


def test_batches_hold_obs_actions_steps_tasks(tmp_path):
    dm = DemoDataModule(
        env_kwargs=KW, demos_per_task=1, num_workers=0, batch_size=16, cache_dir=str(tmp_path)
    )
    dm.load()
    batch = next(iter(dm.train_dataloader()))
    assert batch["actions"].shape == (16, 4) and batch["step"].shape == (16,)
    assert batch["obs"]["proprio"].shape == (16, 39) and batch["obs"]["instruction_ids"].dtype == torch.int64
    assert set(batch["task_id"].tolist()) <= {0, 1}
    assert (dm.obs_dim, dm.action_dim, dm.continuous) == (0, 4, True)


def test_unknown_task_and_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown Meta-World v3 task.*known:.*reach-v3"):
        DemoDataModule(env_kwargs={"tasks": "reach-v9", "image": False}, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="--data.demos_per_task must be >= 1"):
        DemoDataModule(env_kwargs=KW, demos_per_task=0, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="--data.env_id.*Meta-World"):
        DemoDataModule(env_id="CartPole-v1", cache_dir=str(tmp_path))


@pytest.mark.multiproc
@pytest.mark.slow
def test_generation_in_spawned_processes_matches_in_process(tmp_path):
    a = DemoDataModule(env_kwargs=KW, demos_per_task=1, num_workers=0, cache_dir=str(tmp_path / "a")).load()
    b = DemoDataModule(env_kwargs=KW, demos_per_task=1, num_workers=2, cache_dir=str(tmp_path / "b")).load()
    torch.testing.assert_close(a.actions, b.actions, rtol=0, atol=0)
    torch.testing.assert_close(a.obs["proprio"], b.obs["proprio"], rtol=0, atol=0)
    assert a.expert == b.expert
