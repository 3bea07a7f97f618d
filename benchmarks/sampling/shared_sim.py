"""An emulated *shared simulator*, FAST's own setting (FAST §background, §execution time).

In FAST's setup every clip lives in one simulator process. The model here:

- **Resets.** Only a global reset exists. Reloading a clip's scenario (HD map, traffic) takes
  ``reset_s`` and the simulator reloads the clips one after another, so a global reset of N
  clips takes ``N × reset_s``. Each clip's ``reset()`` sleeps ``reset_s`` under the simulator's
  lock: the Collector resets clips on a thread pool, and the lock serialises them.
- **Steps.** The simulator advances all clips together, as on FAST's 8-GPU node: one tick
  costs ``step_s`` however many clips are stepped. The Collector steps the active clips one
  after another inside a row; the first clip stepped in a tick sleeps ``step_s``, the others
  ride along for free. (A clip stepped twice starts a new tick; a reset starts a new one too.)
- **Episodes.** Each clip replays episode lengths drawn, with replacement, from a pool of
  ``(length, terminated)`` pairs measured on the real environment (the sampling benchmark
  uses the complete episodes of its real-stepping runs). ``terminated=False`` is a time-limit
  truncation, as in highway-env's ``duration``.

Observations are zeros of the real env's observation shape; rewards are 0. The model is
only as good as these three assumptions, and the benchmark states them in its results.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np


class SharedSimulator:
    """The one simulator all clips live in; see the module docstring for the cost model."""

    def __init__(self, *, step_s: float, reset_s: float) -> None:
        if step_s < 0 or reset_s < 0:
            raise ValueError(f"SharedSimulator needs step_s, reset_s >= 0, got {step_s}, {reset_s}")
        self.step_s = float(step_s)
        self.reset_s = float(reset_s)
        self._lock = threading.Lock()
        self._tick: set[int] = set()
        self.ticks = 0
        self.scenario_loads = 0

    def load_scenario(self) -> None:
        """Reload one clip's scenario; loads of several clips queue behind one another."""
        with self._lock:
            if self.reset_s > 0:
                time.sleep(self.reset_s)  # emulated scenario reload (serialised)
            self._tick.clear()
            self.scenario_loads += 1

    def advance(self, clip: int) -> None:
        """Step ``clip``; the first clip of a tick pays ``step_s`` for all of them."""
        if clip in self._tick or not self._tick:
            if self.step_s > 0:
                time.sleep(self.step_s)  # emulated simulator tick (all clips in parallel)
            self._tick = {clip}
            self.ticks += 1
        else:
            self._tick.add(clip)


class SharedSimClip(gym.Env):
    """One clip of a :class:`SharedSimulator`, replaying measured episode lengths."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        sim: SharedSimulator,
        index: int,
        episodes: Sequence[tuple[int, bool]],
        *,
        observation_space: gym.spaces.Space,
        action_space: gym.spaces.Space,
    ) -> None:
        if not episodes or min(n for n, _ in episodes) < 1:
            raise ValueError("SharedSimClip needs a non-empty pool of episode lengths >= 1")
        self.sim = sim
        self.index = index
        self.episodes = list(episodes)
        self.observation_space = observation_space
        self.action_space = action_space
        self._obs = np.zeros(observation_space.shape, dtype=np.float32)
        self._rng = np.random.default_rng(index)
        self._length, self._terminates, self._t = 1, True, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.sim.load_scenario()
        self._length, self._terminates = self.episodes[int(self._rng.integers(len(self.episodes)))]
        self._t = 0
        return self._obs.copy(), {"scenario_load_s": self.sim.reset_s}

    def step(self, action: Any):
        self.sim.advance(self.index)
        self._t += 1
        end = self._t >= self._length
        return self._obs.copy(), 0.0, end and self._terminates, end and not self._terminates, {}


def shared_sim_clips(
    num_clips: int,
    episodes: Sequence[tuple[int, bool]],
    *,
    step_s: float,
    reset_s: float,
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
) -> list[SharedSimClip]:
    """``num_clips`` clips living in one new :class:`SharedSimulator`."""
    sim = SharedSimulator(step_s=step_s, reset_s=reset_s)
    return [
        SharedSimClip(sim, i, episodes, observation_space=observation_space, action_space=action_space)
        for i in range(num_clips)
    ]
