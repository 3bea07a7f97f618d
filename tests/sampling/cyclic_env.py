"""An env whose every reset leaves cyclic garbage, as highway-env's does: a new road whose vehicles
refer back to it. Registered on import, so sampler processes build it from
``tests.sampling.cyclic_env:CyclicGarbage-v0``; each step's info says how many roads its process still
holds (``roads_alive``), live or dead but not collected yet."""

from __future__ import annotations

import gc
import weakref

import gymnasium as gym

from tests.fake_envs import FixedLengthEnv

_ROADS: weakref.WeakSet = weakref.WeakSet()


class _Vehicle:
    def __init__(self, road: _Road) -> None:
        self.road = road


class _Road:
    def __init__(self) -> None:
        self.vehicles = [_Vehicle(self) for _ in range(3)]
        _ROADS.add(self)


class CyclicGarbageEnv(FixedLengthEnv):
    """``FixedLengthEnv`` with a new :class:`_Road` at every reset. A highway-env road lives through
    30 steps of allocations, enough to reach the oldest generation; ``gc.collect(1)`` puts this one
    there at once, so the previous road, dropped here, can only go in a full collection."""

    def reset(self, *, seed=None, options=None):
        self.road = _Road()
        gc.collect(1)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, _ = super().step(action)
        return obs, reward, terminated, truncated, {"roads_alive": len(_ROADS)}


gym.register("CyclicGarbage-v0", entry_point=CyclicGarbageEnv)
