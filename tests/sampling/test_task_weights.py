"""SharedTaskWeights: the in-process copy a Ray sampler actor holds (``ctx=None``) behaves like the shared
one and holds no named semaphore, which a killed actor left in ``/dev/shm`` (issue 40 item 7)."""

from __future__ import annotations

import os

import pytest
import torch

from fastlight.sampling.task_weights import SharedTaskWeights


def semaphores_mapped() -> set[int]:
    """Inodes of the named POSIX semaphores (``/dev/shm/sem.*``) this process has mapped."""
    with open(f"/proc/{os.getpid()}/maps") as f:
        fields = [line.split(None, 5) for line in f]
    return {int(f[4]) for f in fields if len(f) == 6 and f[5].startswith("/dev/shm/sem.")}


class TaskEnv:
    def __init__(self) -> None:
        self.unwrapped, self.weights = self, None

    def set_task_weights(self, weights):
        self.weights = list(weights)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "in-process"])
def test_set_get_apply_and_the_semaphores_each_copy_holds(shared):
    before = semaphores_mapped()
    weights = SharedTaskWeights(torch.multiprocessing.get_context("spawn") if shared else None)
    new = semaphores_mapped() - before
    # The shared copy's lock is a named semaphore (what the check sees); the in-process one has none.
    assert len(new) == (1 if shared else 0)
    env = TaskEnv()
    assert weights.version == 0 and weights.apply([env], seen=0) == 0 and env.weights is None
    weights.set([1.0, 3.0])
    weights.set([2.0, 0.5, 4.0])
    assert weights.get() == (2, [2.0, 0.5, 4.0])
    assert weights.apply([env], seen=0) == 2 and env.weights == [2.0, 0.5, 4.0]
    assert weights.release_if_held_by(os.getpid()) is False  # not held
    with pytest.raises(ValueError, match="need 1..1024 weights, got 0"):
        weights.set([])
