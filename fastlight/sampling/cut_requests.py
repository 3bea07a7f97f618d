"""Rounds cut for the batch they would have missed (``--data.cut_in_flight``, asynchronous runs).

With ``--data.max_staleness`` above 0 a sampler does not wait for the trainer's next weights: it
starts a new round as soon as it has sent one. A training step's super-batch is complete when its
last item arrives; the other samplers are then part-way into their next round, and every step of
those rounds sampled before the next publish reaches the trainer one version old, in the batch
after. That is where an asynchronous run's policy lag comes from (``benchmarks/results/sync.md``,
Run 5), not from the steps sampled during the update.

Cutting those rounds when the batch completes puts their steps into it instead: the trainer asks
every sampler but the one whose item completed the batch to end its round at its next step (FAST
§DPSA's unified truncation: each clip still running is truncated and bootstrapped with V(s_{t+1});
in ``autoreset`` mode the segment ends there, the episodes go on) and waits briefly for those
rounds. What stays stale is what the samplers sample during the update itself. A round that began
only just before (less than ``CUT_MIN_SHARE`` of its sampler's usual round) is left to finish.

One shared 64-bit counter per sampler, no messages: the trainer increments a sampler's counter to
ask; the sampler reads it at the start of each round and cuts once it has moved.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: A round younger than this share of its sampler's usual round is left to finish: its few steps
#: would cost its clips their progress (they are truncated, and reset for the next cycle). Rounds
#: that end together (an aligned fleet) are then left alone; a cut aligns a fleet that is not.
CUT_MIN_SHARE = 0.25


def rounds_to_cut(
    samplers: Sequence[int],
    *,
    last_sender: int | None,
    arrived: Mapping[int, float],
    round_s: Mapping[int, float],
    now: float,
    min_share: float = CUT_MIN_SHARE,
) -> list[int]:
    """The samplers to ask when a batch completes: all but ``last_sender`` (its round began with
    the item that completed the batch), and none whose round began (``arrived``: when its last item
    came) less than ``min_share`` of its usual round length (``round_s``) ago. A sampler with no
    item yet, or no round length yet, is asked."""
    return [
        i
        for i in samplers
        if i != last_sender and now - arrived.get(i, -math.inf) >= min_share * round_s.get(i, 0.0)
    ]


class CutRequests:
    """The trainer's side: one counter per sampler of a rank (:meth:`view` is a sampler's side).

    Created before the samplers start and passed to each with its start-up arguments.
    """

    def __init__(self, ctx: Any, samplers: int) -> None:
        if samplers < 1:
            raise ValueError(f"CutRequests needs at least one sampler, got {samplers}")
        self.counts = ctx.RawArray("q", [0] * samplers)

    def request(self, indices: list[int]) -> None:
        """Ask samplers ``indices`` to cut the round they are sampling (one writer: the trainer)."""
        for i in indices:
            self.counts[i] += 1

    def view(self, index: int) -> CutRequestView:
        return CutRequestView(self.counts, index)


class CutRequestView:
    """Sampler ``index``'s side of :class:`CutRequests`: read at a round's start and every step."""

    def __init__(self, counts: Any, index: int) -> None:
        self.counts, self.index = counts, index

    def count(self) -> int:
        """Requests so far; a round started at count ``c`` is cut once this exceeds ``c``."""
        return int(self.counts[self.index])
