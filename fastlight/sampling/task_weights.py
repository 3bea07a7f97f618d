"""Task-sampling weights shared from the trainer (DWR) with every sampler of a rank.

A fixed-capacity shared-memory vector plus a version counter: the trainer writes new weights
after each update, samplers apply them to their envs (``env.unwrapped.set_task_weights``)
before their next round. Version 0 means "never set" (envs keep their uniform default).

A Ray sampler actor's copy is in-process (``ctx=None``): a process-shared lock's named POSIX
semaphore (``/dev/shm/sem.mp-*``) would outlive an actor ended by ``ray.kill``.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import threading
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from fastlight.procs import OwnedLock

MAX_TASKS = 1024


@runtime_checkable
class TaskWeightedEnv(Protocol):
    """A multi-task env that draws its next task from these (unnormalised) weights at reset."""

    def set_task_weights(self, weights: Sequence[float]) -> None: ...


class SharedTaskWeights:
    """The weights and their version (see the module docstring). ``ctx``: the multiprocessing context the
    samplers start with; ``None``: in-process only (a Ray sampler actor)."""

    def __init__(self, ctx: mp.context.BaseContext | None) -> None:
        self.values = torch.zeros(MAX_TASKS, dtype=torch.float64)
        self._lock: OwnedLock | threading.Lock
        if ctx is None:
            self._count: ctypes.c_int = ctypes.c_int(0)  # what ctx.Value(lock=False) is, in-process
            self._version: ctypes.c_longlong = ctypes.c_longlong(0)
            self._lock = threading.Lock()
            return
        self.values.share_memory_()
        self._count = ctx.Value("i", 0, lock=False)
        self._version = ctx.Value("q", 0, lock=False)
        self._lock = OwnedLock(ctx)  # freed by the pool if a killed sampler held it

    @property
    def version(self) -> int:
        return int(self._version.value)

    def release_if_held_by(self, pid: int) -> bool:
        return isinstance(self._lock, OwnedLock) and self._lock.release_if_held_by(pid)

    def set(self, weights: Sequence[float]) -> None:
        if not 0 < len(weights) <= MAX_TASKS:
            raise ValueError(f"task weights: need 1..{MAX_TASKS} weights, got {len(weights)}")
        with self._lock:
            self.values[: len(weights)] = torch.as_tensor(list(weights), dtype=torch.float64)
            self._count.value = len(weights)
            self._version.value += 1

    def get(self) -> tuple[int, list[float]]:
        with self._lock:
            return int(self._version.value), self.values[: self._count.value].tolist()

    def apply(self, envs: Sequence, seen: int) -> int:
        """Push newer weights into the envs; returns the version applied.

        Every env must be a :class:`TaskWeightedEnv` once weights are set: DWR weights that no env
        applies would leave the task mix unchanged without a word.
        """
        version = self.version
        if version == seen:
            return seen
        version, weights = self.get()
        for env in envs:
            target = env.unwrapped
            if not isinstance(target, TaskWeightedEnv):
                raise TypeError(
                    f"task weights (DynamicWeightedResampling) were set, but env {type(target).__name__} "
                    "has no set_task_weights(weights) (fastlight.sampling.task_weights.TaskWeightedEnv): "
                    "use a multi-task env, or remove the callback"
                )
            target.set_task_weights(weights)
        return version
