"""Small deterministic gymnasium envs whose episode lengths are known in advance.

They make DPSA's bookkeeping checkable exactly: every call to ``step`` is counted, observations
encode (env tag, step) and the last one is recognisable. Registered on import, so sampler
processes can build them from ``--data.env_id tests.fake_envs:FixedLength-v0``.
"""

from __future__ import annotations

import os

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
