"""Meta-World adapter: Dict observations, success / time-limit endings, tasks, instructions, rendering,
one MuJoCo model per task and process (the same episodes as one per env and task)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastlight.envs import instructions, metaworld, metaworld_sims, metaworld_tasks, registry, rendering
from fastlight.envs.instructions import instruction_words
from fastlight.envs.metaworld import INSTRUCTIONS, MT10_TASKS, STATE_DIM, MetaWorldEnv
from fastlight.envs.registry import make_env

ZERO = np.zeros(4, dtype=np.float32)


def models_built() -> int:
    """How many MuJoCo models (Meta-World objects) this process has built."""
    return metaworld_sims._BUILT[0]


def live_sims() -> int:
    """How many shared simulations this process holds now."""
    return len(metaworld_sims._SIMS)


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
        words = instruction_words()
        assert words.decode(ids.tolist(), skip_special_tokens=True) == INSTRUCTIONS[name]
        assert int(ids[0]) == words.token_to_id("[BOS]")
        assert int(mask.sum()) == len(INSTRUCTIONS[name].split()) + 1  # words + [BOS]
        assert not bool((ids[mask == 0] != words.token_to_id("[PAD]")).any())
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
        "INSTRUCTIONS": instructions, "instruction_for": instructions,
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


# ---------------------------------------------------------------------- one model per task and process
class OwnModels(MetaWorldEnv):
    """The behaviour before sharing: one Meta-World object per env and task, used directly."""

    _share_models = False


def _record(out: list, *items) -> None:
    """One entry of a trajectory, its arrays copied (an env may reuse its buffers)."""
    out.append(
        tuple(
            dict(x) if isinstance(x, dict) else np.copy(x) if isinstance(x, np.ndarray) else x for x in items
        )
    )


def _same(a: list, b: list) -> None:
    """Two trajectories, entry by entry: arrays and floats bitwise, dicts key by key."""
    assert len(a) == len(b)
    for k, (ea, eb) in enumerate(zip(a, b, strict=True)):
        assert len(ea) == len(eb), k
        for xa, xb in zip(ea, eb, strict=True):
            if isinstance(xa, dict):
                assert xa.keys() == xb.keys(), k
                for key in xa:
                    if isinstance(xa[key], np.ndarray):
                        assert xa[key].tobytes() == xb[key].tobytes(), (k, key)
                    else:
                        assert xa[key] == xb[key] and type(xa[key]) is type(xb[key]), (
                            k,
                            key,
                            xa[key],
                            xb[key],
                        )
            elif isinstance(xa, np.ndarray):
                assert xa.dtype == xb.dtype and xa.tobytes() == xb.tobytes(), k
            else:
                assert xa == xb and type(xa) is type(xb), (k, xa, xb)


#: Reach (the scripted expert succeeds), a drawer and a door: their resets move static bodies of the
#: model (``model.body(...).pos``), which the physics reads, so a state's own copy of them matters.
TASKS3 = "reach-v3,drawer-open-v3,door-open-v3"


def _play_interleaved(cls: type[MetaWorldEnv], n_envs: int = 3, rounds: int = 150) -> tuple[list, dict]:
    """Envs stepped one after another (env 0, env 1, ... as a sampler does), all starting on the drawer;
    an env whose episode ends resets into a task its own RNG picks (as MT10 runs), or one forced on
    it, so envs switch tasks and come back to tasks others play meanwhile. Reach plays Meta-World's
    scripted expert (successes end episodes), the others random actions."""
    from metaworld.policies import SawyerReachV3Policy

    expert = SawyerReachV3Policy()
    envs = [cls(tasks=TASKS3, image=False, max_path_length=60) for _ in range(n_envs)]
    rngs = [np.random.default_rng(100 + i) for i in range(n_envs)]
    log: list = []
    seen = {"pairs": set(), "together": 0, "ends": 0, "successes": 0}
    for i, env in enumerate(envs):
        obs, info = env.reset(seed=i, options={"task_id": 1})  # one drawer each, at its own place
        _record(log, "reset", i, obs, info, env.state)
    for _ in range(rounds):
        tasks_now = [env.task_id for env in envs]
        seen["together"] += len(tasks_now) - len(set(tasks_now))
        for i, env in enumerate(envs):
            seen["pairs"].add((i, env.task_id))
            if env.task_id == 0:
                action = np.clip(expert.get_action(env.state), -1, 1).astype(np.float32)
            else:
                action = rngs[i].uniform(-1, 1, 4).astype(np.float32)
            obs, reward, term, trunc, info = env.step(action)
            _record(log, "step", i, obs, reward, term, trunc, info, env.state)
            if term or trunc:
                seen["ends"] += 1
                seen["successes"] += int(info["success"])
                # back to reach (a task others play), a task of its own RNG's choice, or the next one
                forced = [{"task_id": 0}, None, {"task_id": (i + seen["ends"]) % 3}][seen["ends"] % 3]
                obs, info = env.reset(options=forced)
                _record(log, "reset", i, obs, info, env.state)
    for env in envs:
        env.close()
    return log, seen


def test_shared_models_play_the_episodes_of_one_model_per_env():
    """The same seeds give the same episodes, bitwise (observations, rewards, endings, success and
    Meta-World's step metrics, the full 39-d state), with one Meta-World object per task shared by
    three envs as with one per env and task; and the shared run builds one model per task."""
    built = models_built()
    own, seen_own = _play_interleaved(OwnModels)
    own_built = models_built() - built
    built = models_built()
    shared, seen = _play_interleaved(MetaWorldEnv)
    shared_built = models_built() - built
    _same(own, shared)
    assert seen == seen_own
    # The schedule did what it is there for: several envs on one task at once, task switches,
    # successes and time limits.
    assert seen["together"] > 50 and seen["successes"] >= 2 and seen["ends"] > seen["successes"]
    assert {t for _, t in seen["pairs"]} == {0, 1, 2}
    assert own_built == len(seen["pairs"]) > 3 and shared_built == 3


def test_image_frames_are_the_same_with_shared_models():
    """Two envs on one task's shared object (one renderer, one GL context) draw their own scenes,
    frame for frame as with an object each, across a task switch and back."""

    def play(cls: type[MetaWorldEnv]) -> list:
        envs = [cls(tasks="reach-v3,push-v3", image_size=32, camera_name="topview") for _ in range(2)]
        log: list = []
        move = np.array([0.6, -0.4, 0.3, 1.0], dtype=np.float32)
        for i, env in enumerate(envs):
            _record(log, *env.reset(seed=10 + i, options={"task_id": 0}))
        for k in range(9):
            if k == 3:
                _record(log, *envs[0].reset(options={"task_id": 1}))  # env 1 stays on reach
            if k == 6:
                _record(log, *envs[0].reset(options={"task_id": 0}))
            for env in envs:
                _record(log, *env.step(move * (1 if k % 2 else -1)))
        for env in envs:
            env.close()
        return log

    own, shared = play(OwnModels), play(MetaWorldEnv)
    _same(own, shared)
    frames = [entry[0]["image"] for entry in shared]
    assert frames[0].std() > 5 and not np.array_equal(frames[0], frames[1])  # two goals, two scenes


def test_concurrent_resets_of_one_task_keep_each_envs_state():
    """Resets on a thread pool (the Collector's first global reset) of four envs sharing one task:
    each env's episode is the one it plays alone with an object of its own."""

    def play(cls: type[MetaWorldEnv], threaded: bool) -> list:
        envs = [cls(tasks="reach-v3", image=False) for _ in range(4)]
        if threaded:
            with ThreadPoolExecutor(4) as pool:
                starts = list(pool.map(lambda i: envs[i].reset(seed=i), range(4)))
        else:
            starts = [env.reset(seed=i) for i, env in enumerate(envs)]
        log: list = []
        for obs, info in starts:
            _record(log, obs, info)
        for k in range(5):
            for env in envs:
                _record(log, *env.step(np.full(4, 0.2 * k - 0.4, dtype=np.float32)))
        for env in envs:
            env.close()
        return log

    _same(play(OwnModels, threaded=False), play(MetaWorldEnv, threaded=True))


def test_an_mt10_sampler_builds_one_model_per_task():
    """8 MT10 envs (a sampler's) meeting every task build 10 models, not 80; the last env to close
    frees them."""
    live, built = live_sims(), models_built()
    envs = [MetaWorldEnv("MT10", image=False) for _ in range(8)]
    for k in range(len(MT10_TASKS)):
        for i, env in enumerate(envs):
            env.reset(seed=i if k == 0 else None, options={"task_id": (k + i) % 10})
    assert all(len(env._sims) == 10 and len(env._states) == 1 for env in envs)  # met every task, plays one
    assert models_built() - built == 10
    assert live_sims() - live == 10
    for env in envs[:-1]:
        env.close()
    assert live_sims() - live == 10  # the last env still plays on them
    envs[-1].close()
    assert live_sims() == live
    # The reference mode builds one per env and task.
    built = models_built()
    own = [OwnModels("reach-v3,push-v3", image=False) for _ in range(2)]
    for env in own:
        for k in range(2):
            env.reset(seed=0, options={"task_id": k})
        env.close()
    assert models_built() - built == 4


def test_every_mt10_task_plays_the_same_after_task_switches():
    """An env goes through every MT10 task and comes back to the first three: it starts a task it
    comes back to from a fresh state where an object of its own per task resumes the one it left;
    the episodes are the same, bitwise."""

    def play(cls: type[MetaWorldEnv]) -> list:
        env = cls("MT10", image=False, max_path_length=4)
        rng, log = np.random.default_rng(5), []
        for visit in range(len(MT10_TASKS) + 3):
            _record(log, *env.reset(seed=0 if visit == 0 else None, options={"task_id": visit % 10}))
            for _ in range(4):
                _record(log, *env.step(rng.uniform(-1, 1, 4).astype(np.float32)), env.state)
        env.close()
        return log

    _same(play(OwnModels), play(MetaWorldEnv))


def test_resets_rewrite_only_the_model_arrays_each_env_keeps():
    """Every model array an MT10 task's resets and steps change is one each state keeps its own
    copy of (``STATE_MODEL_FIELDS``); any other would leak from one env's episode into another's.
    And the state-only (texture-less) model differs from Meta-World's own only in its textures."""
    changed_any: set[str] = set()
    texture_counts = {"ntex", "ntexdata", "nnames", "nnames_map", "npaths", "nbuffer"}
    for name in MT10_TASKS:
        env = OwnModels(tasks=name, image=False)
        with env._inner(name) as inner:  # built, not reset yet
            model = inner.model
        lean = metaworld_sims.TaskSim(metaworld_sims.SimKey(name, None, "corner2", 64, True))
        full, thin = dict(metaworld_sims._arrays(model)), dict(metaworld_sims._arrays(lean.env.model))
        differ = {k for k in full.keys() | thin.keys() if k not in full or k not in thin}
        differ |= {k for k in full.keys() & thin.keys() if full[k].tobytes() != thin[k].tobytes()}
        counts = [k for k in dir(model) if k.startswith("n") and isinstance(getattr(model, k), int)]
        differ |= {k for k in counts if getattr(model, k) != getattr(lean.env.model, k)}
        assert {k for k in differ if not k.startswith(("tex_", "name_", "names"))} <= texture_counts | {
            "mat_texid"
        }, (name, differ)
        assert model.ntex > 0 and lean.env.model.ntex == 0
        assert lean.env.model.nbuffer < model.nbuffer - 5_000_000
        lean.env.close()
        fresh = {k: v.copy() for k, v in full.items()}
        for seed in (1, 2):
            env.reset(seed=seed)
            for _ in range(3):
                env.step(np.array([0.5, -0.5, 0.5, 1.0], dtype=np.float32))
        changed = {k for k, v in metaworld_sims._arrays(model) if v.tobytes() != fresh[k].tobytes()}
        assert changed <= set(metaworld_sims.STATE_MODEL_FIELDS), (name, changed)
        changed_any |= changed
        env.close()
    assert {"body_pos", "site_pos"} <= changed_any  # the goals and objects do move between episodes


def test_a_dropped_state_cannot_be_used():
    env = MetaWorldEnv("reach-v3,push-v3", image=False)
    env.reset(seed=0, options={"task_id": 0})
    state = env._states["reach-v3"]
    env.reset(options={"task_id": 1})  # the task switch drops it
    assert list(env._states) == ["push-v3"] and state.dropped
    with pytest.raises(RuntimeError, match="dropped"), state.sim.use(state):
        pass
    env.close()
    assert not env._states and not env._sims
    env.reset(seed=0, options={"task_id": 0})  # a closed env takes new ones on its next reset
    assert env._states["reach-v3"] is not state
    env.close()
