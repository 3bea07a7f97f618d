"""Meta-World adapter: Dict observations, success / time-limit endings, tasks, instructions, rendering."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastlight.envs import instructions, metaworld, metaworld_tasks, registry, rendering
from fastlight.envs.metaworld import INSTRUCTIONS, MT10_TASKS, STATE_DIM, MetaWorldEnv
from fastlight.envs.registry import make_env
from fastlight.models.text import decode_instructions

ZERO = np.zeros(4, dtype=np.float32)


def reach(**kw) -> MetaWorldEnv:
    return MetaWorldEnv(**{"tasks": "reach-v3", "image_size": 32, **kw})


def test_registered_id_gives_dict_obs_with_keys_shapes_dtypes():
    env = make_env("fastlight/MetaWorld-reach-v3", env_kwargs={"image_size": 32, "proprio_dim": 4})
    try:
        obs, info = env.reset(seed=0)
        assert set(obs) == {"image", "proprio", "instruction_ids", "instruction_mask"}
        assert obs["image"].shape == (32, 32, 3) and obs["image"].dtype == np.uint8
        assert obs["proprio"].shape == (4,) and obs["proprio"].dtype == np.float32
        for key in ("instruction_ids", "instruction_mask"):
            assert obs[key].shape == (16,) and obs[key].dtype == np.int64
        assert env.observation_space.contains(obs)
        assert env.action_space == gym.spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)
        assert info["task_id"] == 0 and info["success"] is False
        right = np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32)
        obs2, reward, terminated, truncated, info2 = env.step(right)
        assert env.observation_space.contains(obs2) and np.isfinite(reward)
        assert info2["task_id"] == 0 and info2["success"] is False and not terminated and not truncated
        assert obs2["image"].std() > 5  # a real frame, not a blank buffer
        assert not np.array_equal(obs2["proprio"], obs["proprio"])  # the hand moved
    finally:
        env.close()


def test_every_mt10_task_is_registered():
    for name in MT10_TASKS:
        spec = gym.spec(f"fastlight/MetaWorld-{name}")
        assert spec.kwargs["tasks"] == name
    assert gym.spec("fastlight/MetaWorld-v0").kwargs["tasks"] == "MT10"


def test_success_terminates_the_episode():
    from metaworld.policies import SawyerReachV3Policy

    expert = SawyerReachV3Policy()
    for terminate in (True, False):
        env = reach(image=False, terminate_on_success=terminate)  # proprio = the full 39-d state
        obs, _ = env.reset(seed=3)
        for _ in range(env.max_path_length):
            action = expert.get_action(obs["proprio"].astype(np.float64))
            obs, _, terminated, truncated, info = env.step(action)
            if info["success"]:
                break
        assert info["success"] is True and not truncated
        assert terminated is terminate
        env.close()


def test_max_path_length_truncates():
    env = reach(image=False, max_path_length=5)
    env.reset(seed=0)
    ends = [env.step(ZERO)[2:4] for _ in range(5)]
    assert ends == [(False, False)] * 4 + [(False, True)]
    env.reset()  # a new episode after the time limit works (the inner env's own guard did not fire)
    assert env.step(ZERO)[2:4] == (False, False)
    env.close()


def test_state_only_mode_has_no_image():
    env = reach(image=False, proprio_dim=STATE_DIM)
    obs, _ = env.reset(seed=0)
    assert "image" not in obs and "image" not in env.observation_space.spaces
    assert obs["proprio"].shape == (STATE_DIM,) and env.render() is None
    env.close()
    with pytest.raises(ValueError, match="proprio_dim"):
        reach(image=False, proprio_dim=0)


def test_instruction_ids_decode_to_the_sentence():
    env = MetaWorldEnv("MT10", image=False)  # built lazily: no MuJoCo model until a reset
    assert env.task_names == MT10_TASKS
    for k, name in enumerate(MT10_TASKS):
        env._task = k
        obs = env._obs(np.zeros(STATE_DIM))
        ids, mask = torch.as_tensor(obs["instruction_ids"]), torch.as_tensor(obs["instruction_mask"])
        assert decode_instructions(env.tokenizer, ids[None]) == [INSTRUCTIONS[name]]
        assert int(ids[0]) == env.tokenizer.bos_token_id
        assert int(mask.sum()) == len(INSTRUCTIONS[name].split()) + 1  # words + [BOS]
        assert not bool((ids[mask == 0] != env.tokenizer.pad_token_id).any())
    # Ids do not depend on which tasks an env runs (the vocabulary covers every MT10 sentence).
    single = reach(image=False)
    single._task = 0
    np.testing.assert_array_equal(single._obs(np.zeros(STATE_DIM))["instruction_ids"], env._ids[0])
    with pytest.raises(ValueError, match="max_text_len"):
        reach(max_text_len=4)


def test_task_sampling_follows_weights_and_task_id_is_reported():
    env = MetaWorldEnv("reach-v3,push-v3", image=False)
    env.set_task_weights([0.0, 2.0])
    seen = set()
    for _ in range(4):
        obs, info = env.reset()
        seen.add(info["task_id"])
        assert env.step(ZERO)[4]["task_id"] == info["task_id"]
        np.testing.assert_array_equal(obs["instruction_ids"], env._ids[info["task_id"]])
    assert seen == {1}
    _, info = env.reset(options={"task_id": 0})
    assert info["task_id"] == 0 and env.task_id == 0
    with pytest.raises(ValueError, match="task weights"):
        env.set_task_weights([1.0])
    with pytest.raises(ValueError, match="task weights"):
        env.set_task_weights([0.0, 0.0])
    env.close()
    with pytest.raises(ValueError, match="unknown Meta-World v3 task"):
        MetaWorldEnv("reach-v3,reech-v3")


def test_several_envs_and_threads_render_their_own_frames():
    """Resets on a thread pool (as the Collector does) and steps in the main thread give the same
    frames as one env alone: each frame uses its own env's GL context, in the calling thread."""

    def frames(n: int, threaded: bool) -> list[np.ndarray]:
        envs = [reach(camera_name="topview") for _ in range(n)]
        if threaded:
            with ThreadPoolExecutor(n) as pool:
                list(pool.map(lambda i: envs[i].reset(seed=i), range(n)))
        else:
            for i, e in enumerate(envs):
                e.reset(seed=i)
        out = [e.step(np.array([0.5, 0.5, 0.0, 0.0], dtype=np.float32))[0]["image"] for e in envs]
        for e in envs:
            e.close()
        return out

    alone = frames(1, threaded=False)[0]
    together = frames(2, threaded=True)
    assert together[0].std() > 5
    np.testing.assert_array_equal(together[0], alone)
    assert not np.array_equal(together[0], together[1])  # env 1 has another goal


def test_importing_the_adapter_leaves_mujoco_gl_unset():
    """The library never picks the OpenGL backend on import (the CLI, the Makefile and tests do)."""
    env = {k: v for k, v in os.environ.items() if k != "MUJOCO_GL"}
    code = (
        "import os, gymnasium as gym, fastlight.envs.metaworld\n"
        "assert 'MUJOCO_GL' not in os.environ, os.environ['MUJOCO_GL']\n"
        "assert gym.spec('fastlight/MetaWorld-reach-v3').kwargs['tasks'] == 'reach-v3'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_image_mode_without_mujoco_gl_names_the_variable(monkeypatch):
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    with pytest.raises(RuntimeError, match="set MUJOCO_GL=egl"):
        reach()
    reach(image=False).close()  # state-only mode renders nothing and needs no backend


def test_moved_names_stay_importable_from_the_adapter_module():
    homes = {
        "INSTRUCTIONS": instructions, "instruction_for": instructions, "instruction_tokenizer": instructions,
        "MT10_TASKS": metaworld_tasks, "STATE_DIM": metaworld_tasks, "parse_tasks": metaworld_tasks,
        "goal_variations": metaworld_tasks, "register_envs": registry, "render_offscreen": rendering,
    }  # fmt: skip
    for name, home in homes.items():
        assert getattr(metaworld, name) is getattr(home, name), name
    assert gym.spec("fastlight/MetaWorld-v0").entry_point == "fastlight.envs.metaworld:MetaWorldEnv"


def test_reward_modes_pay_success_without_rewarding_hovering():
    """``success``: reward_scale once, at the first success; ``dense_success``: the shaped reward plus
    what the remaining steps could have paid, at the success that ends the episode."""
    from metaworld.policies import SawyerReachV3Policy

    def play(reward: str, **kw):
        env = MetaWorldEnv(tasks="reach-v3", image=False, max_path_length=100, reward=reward, **kw)
        obs, _ = env.reset(seed=1)
        expert, rewards, done = SawyerReachV3Policy(), [], False
        while not done:
            obs, r, term, trunc, info = env.step(np.clip(expert.get_action(env.state), -1, 1))
            rewards.append(r)
            done = term or trunc
        env.close()
        return np.asarray(rewards), term, env

    dense, term, _ = play("dense", reward_scale=0.5)
    assert term and len(dense) < 100
    sparse, term, _ = play("success", reward_scale=0.5)
    assert list(sparse[:-1]) == [0.0] * (len(sparse) - 1) and sparse[-1] == 0.5
    shaped, term, _ = play("dense_success", reward_scale=0.5)
    np.testing.assert_allclose(shaped[:-1], dense[:-1], rtol=0, atol=1e-9)
    left = 100 - len(shaped)
    assert shaped[-1] == pytest.approx(dense[-1] + 0.5 * 10.0 * left)
    # finishing is worth at least staying at the best per-step reward until the time limit
    assert shaped[-1] >= 0.5 * 10.0 * left
    with pytest.raises(ValueError, match="--data.env_kwargs.reward must be one of dense | success"):
        MetaWorldEnv(tasks="reach-v3", image=False, reward="sparse")
