"""The running bookkeeping of one env's episode inside a Collector, what one env did with its action
chunk, and the record an ended (or cut) episode leaves in its Rollout."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fastlight.rollout import EpisodeRecord, crashed_at_end


class Episode:
    """Running bookkeeping of one env's current episode."""

    __slots__ = ("step", "ret", "task_id", "success", "transitions")

    def __init__(self, task_id: int = 0) -> None:
        self.step = 0  # env steps
        self.transitions = 0  # policy steps (rows) of the episode: ``step`` unless actions come in chunks
        self.ret = 0.0
        self.task_id = task_id
        self.success: bool | None = None  # fastlight.rollout.success_after, folded over the steps


class ChunkResult(NamedTuple):
    """What one env did with its action chunk: ``steps`` env steps taken, the finite ``rewards`` of
    them, how the last one ended, its info, and whether it was non-finite under ``nonfinite="drop"``."""

    steps: int
    rewards: list[float]
    terminated: bool
    truncated: bool
    info: dict
    dropped: bool


def record(ep: Episode, *, terminated: bool, truncated: bool, info: dict, cut: bool = False) -> EpisodeRecord:
    numeric = {k: float(v) for k, v in info.items() if isinstance(v, (int, float, np.floating, np.integer))}
    return EpisodeRecord(
        length=ep.step,
        ret=ep.ret,
        terminated=terminated,
        truncated=truncated,
        task_id=ep.task_id,
        success=ep.success,
        crashed=crashed_at_end(info),
        cut=cut,
        info=numeric,
    )
