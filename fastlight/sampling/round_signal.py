"""A rank's samplers end their rounds together (``--data.rank_rounds``).

The trainer needs one item from each sampler for a training step, so it pays for the spread of
their rounds. :class:`RoundSignal` is the rank's shared word on when a round ends;
``--data.max_staleness`` picks which event sets it:

- **Strictly on-policy** (``max_staleness 0``): DPSA's termination rate over every clip of the
  rank (FAST §DPSA: "the proportion of terminated clips among all clips"), so all samplers truncate
  within one step of each other; the cut depends on the processes' relative speed (not reproducible).
- **Asynchronous** (``max_staleness`` above 0): the cut in flight. When a training step's
  super-batch completes, the trainer asks every other sampler to end its round at its next step
  (FAST §DPSA's unified truncation) and the batch takes those rounds, unless one began less than
  ``CUT_MIN_SHARE`` of its usual round ago.

Shared memory, no messages. For the rate: two 64-bit slots per sampler hold ``cycle key << 16 | ended
clips`` of its current cycle and of the one before (a sampler whose clips all ended moves on, and
they still count in the rate of the cycle the others are finishing), and one counter holds the
highest cycle key that any sampler has cut: every sampler on that key cuts at its next step. For the
cut in flight: one request counter per sampler, which the trainer increments to ask.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastlight.sampling.collector_settings import RATE_MODES, RESET_MODES

#: Cycle index bits of a key (``version * CYCLES + k``): at most this many cycles per version.
CYCLES = 64
_ENDED_BITS = 16
_ENDED_MASK = (1 << _ENDED_BITS) - 1

#: A round younger than this share of its sampler's usual round is left to finish: its few steps
#: would cost its clips their progress (they are truncated, and reset for the next cycle).
CUT_MIN_SHARE = 0.25


def together_blockers(
    *, reset_mode: str, max_staleness: int, termination_threshold: float | str, cycles_per_step: int
) -> dict[str, tuple[object, str]]:
    """The settings that keep a rank's samplers from ending their rounds together: flag -> (value,
    what it must be). Only the shared rate (``max_staleness 0``) has any."""
    wrong: dict[str, tuple[object, str]] = {}
    if max_staleness > 0:
        return wrong
    if not RESET_MODES[reset_mode].shares_rate:
        wrong["--data.reset_mode"] = (reset_mode, RATE_MODES)
    if termination_threshold == "auto":
        wrong["--data.termination_threshold"] = (termination_threshold, "a number, not auto")
    if cycles_per_step > CYCLES:
        wrong["--data.cycles_per_step"] = (cycles_per_step, f"<= {CYCLES}")
    return wrong


def cycle_key(version: int, k: int) -> int:
    """The key of the ``k``-th cycle sampled on policy ``version`` (``0 <= k < CYCLES``)."""
    if not 0 <= k < CYCLES:
        raise ValueError(f"cycle index must be in [0, {CYCLES}), got {k}")
    return version * CYCLES + k


def rounds_to_cut(
    samplers: Sequence[int],
    *,
    last_sender: int | None,
    arrived: Mapping[int, float],
    round_s: Mapping[int, float],
    now: float,
    min_share: float = CUT_MIN_SHARE,
) -> list[int]:
    """The samplers to ask when a batch completes: all but ``last_sender``, and none whose round began
    (``arrived``: its last item) less than ``min_share`` of its usual round length (``round_s``) ago."""
    return [
        i
        for i in samplers
        if i != last_sender and now - arrived.get(i, -math.inf) >= min_share * round_s.get(i, 0.0)
    ]


class RoundSignal:
    """The shared words of one rank's samplers (the trainer's side); :meth:`view` is one sampler's.

    Args:
        ctx: the multiprocessing context the samplers start with.
        num_envs: clips of each sampler, by index.
        shared_rate: ``max_staleness 0``: the rank's termination rate ends the cycles; otherwise the
            trainer's :meth:`request` ends the rounds in flight.
    """

    def __init__(self, ctx: Any, num_envs: Sequence[int], *, shared_rate: bool) -> None:
        if not num_envs or any(n < 1 or n > _ENDED_MASK for n in num_envs):
            raise ValueError(f"RoundSignal needs 1..{_ENDED_MASK} clips per sampler, got {list(num_envs)}")
        self.shared_rate = shared_rate
        # [current cycle of sampler 0..W-1, previous cycle of sampler 0..W-1]
        self.slots = ctx.RawArray("q", [-1] * (2 * len(num_envs)))
        self.cut = ctx.Value("q", -1)  # with its lock: see RoundView.mark
        self.requests = ctx.RawArray("q", [0] * len(num_envs))
        self.total = int(sum(num_envs))

    def request(self, indices: list[int]) -> None:
        """Ask samplers ``indices`` to cut the round they are sampling (one writer: the trainer)."""
        for i in indices:
            self.requests[i] += 1

    def view(self, index: int) -> RoundView:
        return RoundView(self, index)


class RoundView:
    """Sampler ``index``'s side of its rank's :class:`RoundSignal`, used by its Collector every step."""

    def __init__(self, signal: RoundSignal, index: int) -> None:
        self.shared_rate, self.index, self.total = signal.shared_rate, index, signal.total
        self.slots, self._cut, self._requests = signal.slots, signal.cut, signal.requests
        self._prev = len(signal.requests) + index
        self._since: int | None = None  # the request count when this sampler's round began

    def start_round(self) -> None:
        """A training step's round begins: a request from here on ends it."""
        self._since = int(self._requests[self.index])

    def cut_asked(self) -> bool:
        """Whether the trainer asked, since this round began, for the round under way."""
        return self._since is not None and self._requests[self.index] > self._since

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
        n = sum(v & _ENDED_MASK for v in self.slots[:] if v >= 0 and v >> _ENDED_BITS == key)
        return n / self.total

    def was_cut(self, key: int) -> bool:
        """Whether some sampler has already cut cycle ``key`` (then this one cuts too)."""
        return self._cut.value >= key

    def mark(self, key: int) -> None:
        """This sampler cut cycle ``key``: every sampler on it cuts at its next step."""
        with self._cut.get_lock():  # a sampler one cycle behind must not lower a later key
            if self._cut.value < key:
                self._cut.value = key

    def rank_cut(self, key: int, ended: int, reached: Callable[[float], bool]) -> bool:
        """Whether cycle ``key`` ends at this step for the rank: some sampler cut it already, or the
        rate over the rank's clips is ``reached`` (then it is marked for the others)."""
        fraction = self.ended_fraction(key, ended)
        if self.was_cut(key):
            return True
        if reached(fraction):
            self.mark(key)
            return True
        return False
