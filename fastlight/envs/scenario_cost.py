"""``ScenarioLoadCost``: an emulated scenario-load latency on ``reset()``, as an env wrapper.

The driving simulators FAST targets reload HD maps and rebuild traffic on every reset, which takes
seconds (FAST §background). This wrapper adds a configurable wall-clock sleep to ``reset()`` to
reproduce that cost; a sleep models I/O-bound loading (no CPU; resets of one sampler overlap).

It is part of the env spec: ``--data.env_wrappers [{class_path: fastlight.envs.ScenarioLoadCost,
init_args: {seconds: 0.2}}]``; benchmarks wrap their own envs with ``ScenarioLoadCost(seconds=s).wrap(env)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from fastlight.envs.wrappers import EnvWrapper


@dataclass(frozen=True)
class ScenarioLoadCost(EnvWrapper):
    """Adds ``seconds`` of emulated scenario loading to every ``reset()`` of the envs it wraps.

    Args:
        seconds: wall-clock sleep added to each ``reset()`` (>= 0).
    """

    seconds: float

    def __post_init__(self) -> None:
        if self.seconds < 0:
            raise ValueError(f"ScenarioLoadCost seconds must be >= 0, got {self.seconds}")

    def wrap(self, env: gym.Env) -> gym.Env:
        return ScenarioLoadEnv(env, seconds=self.seconds)


class ScenarioLoadEnv(gym.Wrapper):
    """The env side of :class:`ScenarioLoadCost`: sleeps ``seconds`` before each ``reset()``.

    ``info["scenario_load_s"]`` reports the emulated time, so logs never mistake it for
    simulator work.
    """

    def __init__(self, env: gym.Env, *, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"ScenarioLoadCost seconds must be >= 0, got {seconds}")
        super().__init__(env)
        self.seconds = float(seconds)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.seconds > 0:
            time.sleep(self.seconds)  # emulated HD-map / traffic reload (I/O bound)
        obs, info = self.env.reset(seed=seed, options=options)
        info = dict(info)
        info["scenario_load_s"] = self.seconds
        return obs, info
