"""Envs that fail in one named way, for the tests of what a sampler says when an env goes wrong.

Registered on import, so sampler processes build them from ``tests.sampling.error_envs:<id>``. Each
counts the instances made in its process: ``bad_instance`` picks which env of a sampler misbehaves
(a sampler builds its envs in index order).
"""

from __future__ import annotations

import os
import sys

import gymnasium as gym
import numpy as np

from tests.fake_envs import FixedLengthEnv


class _Counted(FixedLengthEnv):
    made = 0

    def __init__(self, bad_instance: int = 0, bad_step: int = 2, **kw) -> None:
        super().__init__(**kw)
        self.instance = type(self).made
        type(self).made += 1
        self.bad = self.instance == bad_instance
        self.bad_step = bad_step


class OddShapeEnv(_Counted):
    """Observations of shape (3,), except the bad instance's at ``bad_step``: shape (4,)."""

    def step(self, action):
        obs, *rest = super().step(action)
        if self.bad and self.t == self.bad_step:
            obs = np.append(obs, 0.0).astype(np.float32)
        return (obs, *rest)


class RaisingEnv(_Counted):
    """The bad instance raises in its ``bad_step``-th step of an episode."""

    def step(self, action):
        if self.bad and self.t + 1 == self.bad_step:
            raise RuntimeError("the simulator lost its road network")
        return super().step(action)


class FlakyEnv(_Counted):
    """The bad instance raises once in its ``bad_step``-th step, in whichever process first gets there
    (``flag_dir/raised`` marks it): a simulator that throws now and then."""

    def __init__(self, flag_dir: str = "", **kw) -> None:
        super().__init__(**kw)
        self.flag = os.path.join(flag_dir, "raised")

    def step(self, action):
        if self.bad and self.t + 1 == self.bad_step and not os.path.exists(self.flag):
            open(self.flag, "w").close()
            raise RuntimeError("the simulator lost its road network")
        return super().step(action)


class MemoryHogEnv(FixedLengthEnv):
    """Holds ``hold_mib`` MiB of touched memory from its first reset on, then writes
    ``<ready_dir>/<pid>`` so that a test knows the memory is held."""

    def __init__(self, hold_mib: int = 0, ready_dir: str = "") -> None:
        super().__init__(lengths=(4,))
        self.hold_mib, self.ready_dir = hold_mib, ready_dir
        self.held: np.ndarray | None = None

    def reset(self, *, seed=None, options=None):
        if self.held is None:
            self.held = np.ones(self.hold_mib * 2**20, dtype=np.uint8)  # ones: every page is touched
            if self.ready_dir:
                with open(os.path.join(self.ready_dir, str(os.getpid())), "w") as f:
                    f.write(str(self.hold_mib))
        return super().reset(seed=seed, options=options)


class WhichFastlightEnv(FixedLengthEnv):
    """Writes the file of the ``fastlight`` package its process imported to ``<report_dir>/<pid>``."""

    def __init__(self, report_dir: str) -> None:
        super().__init__()
        self.report_dir = report_dir

    def reset(self, *, seed=None, options=None):
        with open(os.path.join(self.report_dir, str(os.getpid())), "w") as f:
            f.write(sys.modules["fastlight"].__file__)
        return super().reset(seed=seed, options=options)


gym.register("OddShape-v0", entry_point=OddShapeEnv)
gym.register("Raising-v0", entry_point=RaisingEnv)
gym.register("Flaky-v0", entry_point=FlakyEnv)
gym.register("MemoryHog-v0", entry_point=MemoryHogEnv)
gym.register("WhichFastlight-v0", entry_point=WhichFastlightEnv)
