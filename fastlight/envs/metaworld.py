"""Meta-World (v3) as a gymnasium env with image + proprio + instruction observations (AcceRL).

:class:`MetaWorldEnv` wraps one or several Meta-World tasks behind a single gymnasium env (AcceRL
§experiments; tasks re-weighted by §Dynamic Weighted Resampling):

- each ``reset`` samples a task (uniformly, or by the weights given to :meth:`set_task_weights`;
  ``options={"task_id": k}`` forces one), then one of the task's goal variations: the 50 goals
  ``metaworld.MT1(name, seed=goal_seed)`` generates (goal-observable, as in the MT benchmarks);
- observation (a ``Dict``)::

      image             uint8 [S, S, 3]     camera frame (absent with ``image=False``)
      proprio           float32 [P]         the first P dims of Meta-World's 39-d state:
                                            [0:3] hand xyz, [3] gripper opening, [4:18] object
                                            poses, [18:36] the same 18 dims one step earlier,
                                            [36:39] goal xyz; P=4 is the robot's own state
                                            (absent with ``proprio_dim=0``)
      instruction_ids   int64 [L]           the task's sentence, tokenized (``[BOS]`` first),
      instruction_mask  int64 [L]           right-padded to ``L = max_text_len``; 1 = real token

  The sentences (:data:`INSTRUCTIONS`) are tokenized over every known sentence, so ids agree across
  envs and processes; ``env.unwrapped.instruction_table`` holds every sentence with its ids;
- actions ``Box(-1, 1, (4,))``: hand xyz displacement and gripper effort;
- the episode *terminates* on ``info["success"]`` (``terminate_on_success``) and is
  *truncated* after ``max_path_length`` steps (default 200, not Meta-World's 500);
- ``info`` carries ``success`` (bool) and ``task_id`` (index into ``env.unwrapped.task_names``)
  at reset and at every step, plus Meta-World's own step metrics.

**One model per task and process** (:mod:`fastlight.envs.metaworld_sims`): the envs of a process
share each task's Meta-World object, swapping their own state in, and play bitwise the same episodes.

Rendering is offscreen MuJoCo on the ``MUJOCO_GL`` backend, which this library never sets; an env
with ``image=True`` refuses to start while it is unset.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from fastlight.envs.instructions import INSTRUCTIONS, InstructionTable, instruction_for, instruction_words
from fastlight.envs.metaworld_sims import SimKey, SimState, TaskSim, acquire, release
from fastlight.envs.metaworld_tasks import MT10_TASKS, STATE_DIM, goal_variations, parse_tasks
from fastlight.envs.registry import register_envs
from fastlight.envs.rendering import render_offscreen, require_gl_backend

__all__ = [
    "INSTRUCTIONS", "MT10_TASKS", "STATE_DIM", "MetaWorldEnv", "goal_variations", "instruction_for",
    "parse_tasks", "register_envs", "render_offscreen",
]  # fmt: skip


#: ``reward`` settings of :class:`MetaWorldEnv`.
REWARDS = ("dense", "success", "dense_success")

#: Meta-World's largest per-step shaped reward (v3 rewards lie in [0, 10]).
MAX_STEP_REWARD = 10.0


class MetaWorldEnv(gym.Env):
    """Multi-task Meta-World with a Dict observation (see the module docstring).

    Args:
        tasks: ``"MT10"``, one task name (``"reach-v3"``), a comma-separated list, or a list.
        image: render a camera frame into ``obs["image"]`` (needs ``MUJOCO_GL``); ``False``: state only.
        image_size: side ``S`` of the square frame.
        camera_name: Meta-World camera (e.g. ``corner2``); ``None``: a free one, centred on the first frame.
        proprio_dim: leading state dims in ``obs["proprio"]`` (0..39; 0 drops the key).
        max_text_len: instruction length ``L`` (must fit the longest sentence plus ``[BOS]``).
        max_path_length: steps before truncation.
        terminate_on_success: end the episode (``terminated``) at the first success.
        reward: ``"dense"``: Meta-World's shaped reward (0..10 per step); ``"success"``: 1 at the
            first success, else 0; ``"dense_success"``: dense plus ``10 x steps left`` at a success
            that ends the episode (finishing early is never worth less than hovering at the goal).
        reward_scale: multiplies the reward.
        goal_seed: seed of the 50 goal variations per task (shared by every env and worker).
        fast_render: no shadows / multisampling (much faster on a CPU renderer).
        flip_image: turn Meta-World's upside-down frames upright.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}
    #: Share each task's Meta-World object with the process's other envs (``False``: the tests' reference).
    _share_models = True

    def __init__(
        self,
        tasks: str | Sequence[str] = "MT10",
        image: bool = True,
        image_size: int = 64,
        camera_name: str = "corner2",
        proprio_dim: int = STATE_DIM,
        max_text_len: int = 16,
        max_path_length: int = 200,
        terminate_on_success: bool = True,
        reward: str = "dense",
        reward_scale: float = 1.0,
        goal_seed: int = 0,
        fast_render: bool = True,
        flip_image: bool = True,
        render_mode: str | None = "rgb_array",
    ) -> None:
        super().__init__()
        self.task_names = parse_tasks(tasks)
        if not 0 <= proprio_dim <= STATE_DIM:
            raise ValueError(f"--data.env_kwargs.proprio_dim must be in [0, {STATE_DIM}], got {proprio_dim}")
        if not image and proprio_dim == 0:
            raise ValueError("--data.env_kwargs: image=false needs proprio_dim >= 1 (state-only mode)")
        for name, val in (("image_size", image_size), ("max_path_length", max_path_length)):
            if val < 1:
                raise ValueError(f"--data.env_kwargs.{name} must be >= 1, got {val}")
        if reward not in REWARDS:
            raise ValueError(f"--data.env_kwargs.reward must be one of {' | '.join(REWARDS)}, got {reward!r}")
        if image:
            require_gl_backend("MetaWorldEnv(image=True)")
        self.image, self.image_size, self.camera_name = image, image_size, camera_name
        self.proprio_dim, self.max_text_len, self.max_path_length = proprio_dim, max_text_len, max_path_length
        self.terminate_on_success, self.reward_scale, self.reward = terminate_on_success, reward_scale, reward
        self.goal_seed, self.fast_render, self.flip_image = goal_seed, fast_render, flip_image
        self.render_mode = render_mode
        self.instructions = tuple(instruction_for(n) for n in self.task_names)
        self._extra = tuple(sorted(s for s in self.instructions if s not in INSTRUCTIONS.values()))
        self._words = instruction_words(self._extra)
        self._ids, self._mask = self._encode(max_text_len)
        self.task_weights = np.full(len(self.task_names), 1.0 / len(self.task_names))
        self.observation_space = self._observation_space()
        self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)
        # The simulations of the tasks met, taken on first use, and its states of them; freed at close.
        self._sims: dict[str, TaskSim] = {}
        self._states: dict[str, SimState] = {}
        weakref.finalize(self, _release, self._sims, self._states).atexit = False
        self._task, self._steps = -1, 0
        self._state: np.ndarray | None = None
        self._succeeded = False

    def _encode(self, max_text_len: int) -> tuple[np.ndarray, np.ndarray]:
        from fastlight.envs.instruction_tokens import encode_words

        longest = max(len(self._words.encode(s).ids) for s in self.instructions)
        if max_text_len < longest:
            raise ValueError(
                f"--data.env_kwargs.max_text_len must be >= {longest} (longest instruction + [BOS]), "
                f"got {max_text_len}"
            )
        return encode_words(self._words, list(self.instructions), max_text_len)

    def _observation_space(self) -> gym.spaces.Dict:
        spaces: dict[str, gym.Space] = {}
        if self.image:
            spaces["image"] = gym.spaces.Box(0, 255, (self.image_size, self.image_size, 3), dtype=np.uint8)
        if self.proprio_dim:
            spaces["proprio"] = gym.spaces.Box(-np.inf, np.inf, (self.proprio_dim,), dtype=np.float32)
        vocab = self._words.get_vocab_size()
        spaces["instruction_ids"] = gym.spaces.Box(0, vocab - 1, (self.max_text_len,), dtype=np.int64)
        spaces["instruction_mask"] = gym.spaces.Box(0, 1, (self.max_text_len,), dtype=np.int64)
        return gym.spaces.Dict(spaces)

    def _inner(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """The Meta-World object of task ``name`` with this env's state in, under the task's lock."""
        state = self._states.get(name)
        if state is None:
            sim = self._sims.get(name)
            if sim is None:
                mode = "rgb_array" if self.image else None
                key = SimKey(name, mode, self.camera_name, self.image_size, self.fast_render)
                sim = self._sims[name] = acquire(key, share=self._share_models)
            if self._share_models:
                _drop_states(self._states)
            state = self._states[name] = sim.new_state()
            state.attrs["max_path_length"] = self.max_path_length  # its own step guard must not fire first
        return state.sim.use(state)

    def set_task_weights(self, weights: Sequence[float]) -> None:
        """Sampling weights of the tasks (normalised here); AcceRL's DWR sets them from failure rates."""
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (len(self.task_names),) or not np.all(np.isfinite(w)) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(
                f"task weights must be {len(self.task_names)} finite non-negative numbers with a positive "
                f"sum (tasks {list(self.task_names)}), got {list(np.atleast_1d(w))}"
            )
        self.task_weights = w / w.sum()

    @property
    def task_id(self) -> int:
        """Index of the current episode's task in :attr:`task_names` (-1 before the first reset)."""
        return self._task

    @property
    def state(self) -> np.ndarray:
        """Meta-World's full 39-d state after the last ``reset``/``step`` (what scripted experts read)."""
        if self._state is None:
            raise RuntimeError("MetaWorldEnv.state read before reset")
        return self._state.copy()

    def instruction(self, task_id: int) -> str:
        return self.instructions[task_id]

    @property
    def instruction_table(self) -> InstructionTable:
        """Every instruction row this env emits (one per task) and its sentence."""
        return InstructionTable(self.instructions, self._ids.copy(), self._mask.copy())

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        forced = (options or {}).get("task_id")
        if forced is not None:
            if not 0 <= int(forced) < len(self.task_names):
                raise ValueError(f"options['task_id'] must be in [0, {len(self.task_names)}), got {forced}")
            self._task = int(forced)
        else:
            self._task = int(self.np_random.choice(len(self.task_names), p=self.task_weights))
        name = self.task_names[self._task]
        goals = goal_variations(name, self.goal_seed)
        goal = int(self.np_random.integers(len(goals)))
        with self._inner(name) as env:
            env.set_task(goals[goal])
            state, _ = env.reset()
            self._steps, self._succeeded = 0, False
            obs = self._obs(state)  # the frame, before another env's state comes in
        return obs, {"success": False, "task_id": self._task, "goal_id": goal}

    def step(self, action):
        if self._task < 0:
            raise RuntimeError("MetaWorldEnv.step called before reset")
        act = np.clip(np.asarray(action, dtype=np.float32).reshape(4), -1.0, 1.0)
        with self._inner(self.task_names[self._task]) as env:
            state, reward, _, _, info = env.step(act)
            obs = self._obs(state)
        self._steps += 1
        success = bool(info.get("success", 0.0))
        terminated = success and self.terminate_on_success
        truncated = not terminated and self._steps >= self.max_path_length
        out = {k: float(v) for k, v in info.items() if isinstance(v, (int, float, np.floating, np.integer))}
        out.update(success=success, task_id=self._task)
        if self.reward == "success":
            reward = float(success and not self._succeeded)
        elif self.reward == "dense_success" and terminated:
            reward = float(reward) + MAX_STEP_REWARD * (self.max_path_length - self._steps)
        self._succeeded = self._succeeded or success
        return obs, float(reward) * self.reward_scale, terminated, truncated, out

    def _obs(self, state: np.ndarray) -> dict[str, np.ndarray]:
        self._state = np.asarray(state, dtype=np.float64)
        obs: dict[str, np.ndarray] = {}
        if self.image:
            obs["image"] = self.render()
        if self.proprio_dim:
            obs["proprio"] = np.asarray(state[: self.proprio_dim], dtype=np.float32)
        obs["instruction_ids"] = self._ids[self._task].copy()
        obs["instruction_mask"] = self._mask[self._task].copy()
        return obs

    def render(self) -> np.ndarray | None:
        """The current camera frame ``uint8 [S, S, 3]`` (upright with ``flip_image``)."""
        if self._task < 0 or not self.image:
            return None
        with self._inner(self.task_names[self._task]) as env:
            frame = render_offscreen(env)
            return np.array(frame[::-1] if self.flip_image else frame, dtype=np.uint8, order="C")

    def close(self) -> None:
        _release(self._sims, self._states)


def _drop_states(states: dict[str, SimState]) -> None:
    while states:
        state = states.popitem()[1]
        state.sim.drop(state)


def _release(sims: dict[str, TaskSim], states: dict[str, SimState]) -> None:
    """Give an env's states and simulations back (the last env of a simulation frees its model)."""
    _drop_states(states)
    while sims:
        release(sims.popitem()[1])
