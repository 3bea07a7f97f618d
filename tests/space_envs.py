"""Small envs over the spaces the default policies take natively: pixels, Dict and Tuple observations
with a Discrete part, MultiDiscrete and MultiBinary actions, and a Text part they refuse.

Each step is a fresh one-step problem with a known best action, so a policy that learns anything
shows it in its mean return (a random policy's is stated in each docstring). Episodes last
``length`` steps. Registered on import, so ``--data.env_id tests.space_envs:Pixels-v0`` builds them in
every sampler process.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class _Steps(gym.Env):
    """``length`` steps per episode; a subclass draws ``self.cue`` in ``_draw`` and scores an action."""

    def __init__(self, length: int = 8) -> None:
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._obs(), {}

    def step(self, action):
        reward = float(self._score(action))
        self.t += 1
        self._draw()
        return self._obs(), reward, self.t >= self.length, False, {}


class PixelsEnv(_Steps):
    """A 36x36 RGB image (uint8, ``channels_first`` for ``C, H, W``) lit on its left or right half:
    reward 1 for the action naming the lit side (0 left, 1 right). A random policy scores 0.5 a step."""

    def __init__(self, length: int = 8, channels_first: bool = False) -> None:
        super().__init__(length)
        self.chw = channels_first
        shape = (3, 36, 36) if channels_first else (36, 36, 3)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(2)

    def _draw(self) -> None:
        self.cue = int(self.np_random.integers(2))

    def _obs(self) -> np.ndarray:
        img = self.np_random.integers(0, 40, (36, 36, 3), dtype=np.uint8)  # dim noise
        img[:, 18 * self.cue : 18 * (self.cue + 1)] = 220
        return img.transpose(2, 0, 1).copy() if self.chw else img

    def _score(self, action) -> bool:
        return int(action) == self.cue


class CueEnv(_Steps):
    """``{"cue": Discrete(3), "noise": Box(2)}`` (``tuple_obs``: the Tuple ``(cue, noise)``); reward 1
    for the action equal to the cue. A random policy scores 1/3 a step."""

    def __init__(self, length: int = 8, tuple_obs: bool = False) -> None:
        super().__init__(length)
        parts = {"cue": gym.spaces.Discrete(3), "noise": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}
        self.tuple_obs = tuple_obs
        self.observation_space = gym.spaces.Tuple(parts.values()) if tuple_obs else gym.spaces.Dict(parts)
        self.action_space = gym.spaces.Discrete(3)

    def _draw(self) -> None:
        self.cue = int(self.np_random.integers(3))

    def _obs(self):
        noise = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return (self.cue, noise) if self.tuple_obs else {"cue": self.cue, "noise": noise}

    def _score(self, action) -> bool:
        return int(action) == self.cue


class MultiActionEnv(_Steps):
    """A Box(3) observation; a MultiDiscrete([3, 3]) action scoring 0.5 for each entry equal to
    ``TARGET`` (``binary``: a MultiBinary(4) action, 0.25 for each bit equal to ``BITS``). A random
    policy scores 1/3 (MultiDiscrete) or 0.5 (MultiBinary) a step."""

    TARGET = (2, 0)
    BITS = (1, 0, 1, 1)

    def __init__(self, length: int = 8, binary: bool = False) -> None:
        super().__init__(length)
        self.binary = binary
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.MultiBinary(4) if binary else gym.spaces.MultiDiscrete([3, 3])

    def _draw(self) -> None:
        pass

    def _obs(self) -> np.ndarray:
        return np.full(3, self.t / self.length, dtype=np.float32)

    def _score(self, action) -> float:
        action = np.asarray(action)
        assert action.shape == self.action_space.shape, action.shape  # what env.step receives
        want = np.asarray(self.BITS if self.binary else self.TARGET)
        return float(np.mean(action == want))


class MissionEnv(CueEnv):
    """CueEnv's Dict observation with a Text ``mission`` part besides (which no default policy takes)."""

    def __init__(self, length: int = 8) -> None:
        super().__init__(length)
        parts = self.observation_space.spaces
        self.observation_space = gym.spaces.Dict({**parts, "mission": gym.spaces.Text(8)})

    def _obs(self):
        return {**super()._obs(), "mission": "cue"}


gym.register("Pixels-v0", entry_point=PixelsEnv)
gym.register("Cue-v0", entry_point=CueEnv)
gym.register("MultiAction-v0", entry_point=MultiActionEnv)
gym.register("Mission-v0", entry_point=MissionEnv)
