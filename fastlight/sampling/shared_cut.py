"""DPSA's termination rate over every clip of a trainer rank (``--data.truncation_scope rank``).

FAST §DPSA computes, at each timestep, "the proportion of terminated clips among all clips" and
truncates every clip once it passes the threshold. With one sampler per process, each sampler
computing that rate over its own clips (``truncation_scope: sampler``, the default) ends its cycles
on its own schedule: in a strictly on-policy run the trainer then waits for the slowest sampler
and the others idle until the next weights. :class:`SharedCut` lets a rank's local samplers
compute the rate over all their clips, so all of them truncate within one step of each other.

Shared memory, no messages: two 64-bit slots per sampler hold ``cycle key << 16 | ended clips``
of its current cycle and of the one before (one aligned store each, so a reader never sees a key
with another cycle's count), and one counter holds the highest cycle key that any sampler has cut.
The previous cycle's slot matters when a sampler moves on before the others cut: all its clips
ended (it has nothing left to truncate), and they still count in the rate of the cycle the
others are finishing. A cycle's key is ``version * 64 + k`` for
its ``k``-th cycle on policy ``version``, the same in every sampler of a strictly on-policy rank.
Once one sampler cuts a cycle, every sampler on that key cuts at its next step: a unified
truncation of the rank, as in the paper.

The cut then depends on how fast the processes run relative to each other, so two runs with the
same seeds no longer give the same cycles (with ``sampler`` scope they do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

#: ``--data.truncation_scope``: whose clips DPSA's termination rate counts (``auto``: see
#: :func:`resolve_scope`).
TruncationScope = Literal["sampler", "rank", "auto"]
TRUNCATION_SCOPES: tuple[str, ...] = get_args(TruncationScope)

#: Cycle index bits of a key (``version * CYCLES + k``): at most this many cycles per version.
CYCLES = 64
_ENDED_BITS = 16
_ENDED_MASK = (1 << _ENDED_BITS) - 1


def rank_scope_blockers(
    *, reset_mode: str, max_staleness: int, termination_threshold: float | str, cycles_per_step: int
) -> dict[str, tuple[object, str]]:
    """The settings that keep a rank's samplers from sharing one termination rate: flag -> (value,
    what it must be). A shared rate needs the samplers to sample the same cycles on the same
    weights: DPSA/SGR cycles, strictly on-policy, one fixed threshold."""
    wrong: dict[str, tuple[object, str]] = {}
    if reset_mode not in ("dpsa", "sgr"):
        wrong["--data.reset_mode"] = (reset_mode, "dpsa or sgr")
    if max_staleness != 0:
        wrong["--data.max_staleness"] = (max_staleness, "0")
    if termination_threshold == "auto":
        wrong["--data.termination_threshold"] = (termination_threshold, "a number, not auto")
    if cycles_per_step > CYCLES:
        wrong["--data.cycles_per_step"] = (cycles_per_step, f"<= {CYCLES}")
    return wrong


def resolve_scope(scope: str, *, blockers: dict[str, tuple[object, str]], shared_memory: bool) -> str:
    """``sampler`` or ``rank``: ``auto`` is ``rank`` where it can work (no blockers, samplers on the
    trainer's machine) and ``sampler`` elsewhere; the other two are themselves."""
    if scope != "auto":
        return scope
    return "rank" if not blockers and shared_memory else "sampler"


def cycle_key(version: int, k: int) -> int:
    """The key of the ``k``-th cycle sampled on policy ``version`` (``0 <= k < CYCLES``)."""
    if not 0 <= k < CYCLES:
        raise ValueError(f"cycle index must be in [0, {CYCLES}), got {k}")
    return version * CYCLES + k


class SharedCut:
    """The shared counters of one rank's samplers; :meth:`view` is one sampler's handle.

    Created by the trainer (before the samplers start) and passed to each sampler process with
    its start-up arguments, like the weight buffers.

    Args:
        ctx: the multiprocessing context the samplers start with.
        num_envs: clips of each sampler, by index.
    """

    def __init__(self, ctx: Any, num_envs: Sequence[int]) -> None:
        if not num_envs or any(n < 1 or n > _ENDED_MASK for n in num_envs):
            raise ValueError(f"SharedCut needs 1..{_ENDED_MASK} clips per sampler, got {list(num_envs)}")
        # [current cycle of sampler 0..W-1, previous cycle of sampler 0..W-1]
        self.slots = ctx.RawArray("q", [-1] * (2 * len(num_envs)))
        self.cut = ctx.Value("q", -1)  # with its lock: see SharedCutView.mark
        self.total = int(sum(num_envs))

    def view(self, index: int) -> SharedCutView:
        return SharedCutView(self.slots, self.cut, index, self.total, len(self.slots) // 2)


class SharedCutView:
    """Sampler ``index``'s side of a :class:`SharedCut`, used by its Collector every step."""

    def __init__(self, slots: Any, cut: Any, index: int, total: int, samplers: int) -> None:
        self.slots, self._cut, self.index, self.total = slots, cut, index, total
        self._prev = samplers + index

    def begin(self, key: int) -> None:
        """This sampler starts cycle ``key`` with no clip ended; its last cycle's count stays readable."""
        last = self.slots[self.index]
        # This order: a reader in between misses the last cycle's count for a moment (it cuts a
        # step later), never counts it twice (which would cut early).
        self.slots[self.index] = key << _ENDED_BITS
        self.slots[self._prev] = last

    def ended_fraction(self, key: int, ended: int) -> float:
        """Record ``ended`` clips of this sampler in cycle ``key``; the fraction of the rank's clips
        ended in that cycle (samplers not on ``key`` yet count their clips as running)."""
        self.slots[self.index] = (key << _ENDED_BITS) | ended
        n = 0
        for value in self.slots[:]:
            if value >= 0 and value >> _ENDED_BITS == key:
                n += value & _ENDED_MASK
        return n / self.total

    def was_cut(self, key: int) -> bool:
        """Whether some sampler has already cut cycle ``key`` (then this one cuts too)."""
        return self._cut.value >= key

    def mark(self, key: int) -> None:
        """This sampler cut cycle ``key``: every sampler on it cuts at its next step."""
        with self._cut.get_lock():  # a sampler one cycle behind must not lower a later key
            if self._cut.value < key:
                self._cut.value = key
