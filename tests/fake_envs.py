"""Small deterministic gymnasium envs whose episode lengths are known in advance.

They make DPSA's bookkeeping checkable exactly: every call to ``step`` is counted, observations
encode (env tag, step) and the last one is recognisable. Registered on import, so sampler
processes can build them from ``--data.env_id tests.fake_envs:FixedLength-v0``.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np


class FixedLengthEnv(gym.Env):
    """Episode ``k`` lasts ``lengths[k % len(lengths)]`` steps, then terminates (or truncates
    when ``truncate=True``, like a time limit). Reward 1 per step. obs = [tag, step, 1]."""

    def __init__(self, lengths: tuple[int, ...] = (5,), tag: float = 0.0, truncate: bool = False) -> None:
        self.lengths = list(lengths)
        self.tag = float(tag)
        self.truncate = truncate
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.episode = -1
        self.t = 0
        self.step_calls = 0
        self.reset_calls = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.tag, self.t, 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.reset_calls += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.step_calls += 1
        self.t += 1
        end = self.t >= self.lengths[self.episode % len(self.lengths)]
        return self._obs(), 1.0, end and not self.truncate, end and self.truncate, {}


class CrashingEnv(FixedLengthEnv):
    """Raises after ``crash_after`` steps (a Python error in a sampler)."""

    def __init__(self, crash_after: int = 3, hard: bool = False) -> None:
        super().__init__(lengths=(1000,))
        self.crash_after = crash_after
        self.hard = hard

    def step(self, action):
        if self.step_calls >= self.crash_after:
            if self.hard:
                os._exit(3)  # a hard crash: no traceback, only an exit code
            raise RuntimeError("simulator exploded on purpose")
        return super().step(action)


gym.register("FixedLength-v0", entry_point=FixedLengthEnv)
gym.register("Crashing-v0", entry_point=CrashingEnv)


class TwoTaskEnv(FixedLengthEnv):
    """Task 0 always fails (time limit after 3 steps), task 1 always succeeds (terminates after 2).

    Tasks are drawn at reset from the weights set through ``set_task_weights`` (uniform before).
    """

    task_names = ("fails", "succeeds")  # what RolloutDataModule.task_names (and so DWR) reads

    def __init__(self) -> None:
        super().__init__(lengths=(3,))
        self.weights = np.array([0.5, 0.5])
        self.task = 0

    def set_task_weights(self, weights) -> None:
        self.weights = np.asarray(weights, dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        obs, _ = super().reset(seed=seed)
        self.task = int(self.np_random.choice(len(self.weights), p=self.weights / self.weights.sum()))
        return obs, {"task_id": self.task}

    def step(self, action):
        self.step_calls += 1
        self.t += 1
        info = {"task_id": self.task, "success": self.task == 1 and self.t >= 2}
        if self.task == 1:
            return self._obs(), 1.0, self.t >= 2, False, info
        return self._obs(), 0.0, False, self.t >= 3, info


gym.register("TwoTask-v0", entry_point=TwoTaskEnv)


class ActionEchoEnv(gym.Env):
    """Echoes the action ``env.step`` received in the next observation, so a Rollout shows what
    the env got: ``obs[t + 1]``'s echo part is the env action taken at ``t``.

    ``kind="vector"``: obs ``[x (4), echo (action_dim)]``. ``kind="vla"``: a dict with
    ``proprio = [x (4), echo]`` and fixed random ``instruction_ids`` (a VLA's observation).
    ``x`` is drawn at reset from the seeded ``np_random``, so runs with the same seeds see the
    same observations. Episodes last ``length`` steps.
    """

    def __init__(self, kind: str = "vector", action_dim: int = 2, length: int = 6, vocab: int = 32) -> None:
        self.kind, self.action_dim, self.length, self.vocab = kind, action_dim, length, vocab
        n = 4 + action_dim
        vec = gym.spaces.Box(-np.inf, np.inf, (n,), np.float32)
        if kind == "vector":
            self.observation_space = vec
        else:
            ids = gym.spaces.Box(0, vocab - 1, (5,), np.int64)
            self.observation_space = gym.spaces.Dict({"proprio": vec, "instruction_ids": ids})
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (action_dim,), np.float32)
        self.t = 0

    def _obs(self, echo: np.ndarray):
        vec = np.concatenate([self.x, echo]).astype(np.float32)
        return vec if self.kind == "vector" else {"proprio": vec, "instruction_ids": self.ids.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.x = self.np_random.normal(size=4).astype(np.float32)
        self.ids = self.np_random.integers(1, self.vocab, size=5).astype(np.int64)
        return self._obs(np.zeros(self.action_dim, np.float32)), {}

    def step(self, action):
        self.t += 1
        echo = np.asarray(action, dtype=np.float32).reshape(self.action_dim)
        return self._obs(echo), 0.0, self.t >= self.length, False, {}


gym.register("ActionEcho-v0", entry_point=ActionEchoEnv)


class FaultEnv(FixedLengthEnv):
    """Injects faults for ``tests/faults``: a NaN reward or observation at a given global step
    count (``nan_reward_at`` / ``nan_obs_at``: the env's ``step_calls``, 0 = never), and a
    ``step_sleep`` per step so that a run lasts long enough to be signalled mid-training.
    ``nan_reset_at`` poisons the observation of that reset call (1 = the first);
    ``hang_at`` makes that step call never return (an env stuck in its simulator); with
    ``hang_marker`` (a path) only the first env to create that file hangs, so a restarted sampler
    runs on. Episodes last ``length`` steps."""

    def __init__(
        self,
        length: int = 5,
        nan_reward_at: int = 0,
        nan_obs_at: int = 0,
        nan_value: float = float("nan"),
        step_sleep: float = 0.0,
        nan_reset_at: int = 0,
        hang_at: int = 0,
        hang_marker: str | None = None,
    ) -> None:
        super().__init__(lengths=(length,))
        self.nan_reward_at, self.nan_obs_at = nan_reward_at, nan_obs_at
        self.nan_value, self.step_sleep = nan_value, step_sleep
        self.nan_reset_at, self.hang_at, self.hang_marker = nan_reset_at, hang_at, hang_marker

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        if self.reset_calls == self.nan_reset_at:
            obs = obs.copy()
            obs[1] = self.nan_value
        return obs, info

    def _hang(self) -> None:
        if self.hang_marker:
            try:
                os.close(os.open(self.hang_marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return  # another process of this run already hung: this one runs on
        while True:
            time.sleep(1.0)

    def step(self, action):
        if self.hang_at and self.step_calls + 1 == self.hang_at:
            self._hang()
        if self.step_sleep:
            time.sleep(self.step_sleep)
        obs, reward, term, trunc, info = super().step(action)
        if self.step_calls == self.nan_reward_at:
            reward = self.nan_value
        if self.step_calls == self.nan_obs_at:
            obs = obs.copy()
            obs[1] = self.nan_value
        return obs, reward, term, trunc, info


gym.register("Fault-v0", entry_point=FaultEnv)


class SamplerLengthEnv(FixedLengthEnv):
    """Episodes of ``short`` steps in sampler 0's envs and ``long`` steps in sampler 1's (the sampler
    read from the first reset's seed: ``seed + 1000 w + i``; later global resets draw other seeds);
    each step sleeps ``step_s``, so samplers in separate processes advance at about the same pace."""

    def __init__(self, short: int = 2, long: int = 150, step_s: float = 0.002) -> None:
        super().__init__(lengths=(short,))
        self.short, self.long, self.step_s = short, long, step_s
        self.first = True

    def reset(self, *, seed=None, options=None):
        if seed is not None and self.first:
            self.first = False
            self.lengths = [self.long if (seed // 1000) % 2 else self.short]
        return super().reset(seed=seed, options=options)

    def step(self, action):
        time.sleep(self.step_s)
        return super().step(action)


gym.register("SamplerLength-v0", entry_point=SamplerLengthEnv)


class DictObsEnv(FixedLengthEnv):
    """FixedLength's episodes with a Dict observation: ``{"state": [tag, step, 1], "flag": [1, 0]}``."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = gym.spaces.Dict(
            {
                "state": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
                "flag": gym.spaces.Box(0.0, 1.0, (2,), np.float32),
            }
        )

    def _obs(self) -> dict[str, np.ndarray]:
        return {"state": super()._obs(), "flag": np.array([1.0, 0.0], dtype=np.float32)}


class MultiDiscreteEnv(FixedLengthEnv):
    """FixedLength with a MultiDiscrete action space of ``nvec`` (one of 2 dims no policy takes)."""

    def __init__(self, nvec: list | None = None) -> None:
        super().__init__()
        self.action_space = gym.spaces.MultiDiscrete(nvec or [3, 3])


class FlatMultiDiscrete(gym.ActionWrapper):
    """A gymnasium ActionWrapper for a MultiDiscrete env: one Discrete action over every combination."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.nvec = [int(n) for n in env.action_space.nvec]
        self.action_space = gym.spaces.Discrete(int(np.prod(self.nvec)))

    def action(self, action):
        return np.array(np.unravel_index(int(action), self.nvec))


gym.register("DictObs-v0", entry_point=DictObsEnv)
gym.register("MultiDiscrete-v0", entry_point=MultiDiscreteEnv)
