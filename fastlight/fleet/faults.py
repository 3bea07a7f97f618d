"""``FaultSettings`` (``--data.faults``): how a rank's fleet watches, restarts and gives up on its worker
processes; and what every fleet says and counts when a sampler fails.
"""

from __future__ import annotations

import collections
import sys
import time
from dataclasses import dataclass

from fastlight.weights.checksum import DeliveryCheck

#: The flag these settings live under (errors name it).
FLAG = "--data.faults"


@dataclass(frozen=True)
class FaultSettings:
    """Timeouts, heartbeat and the restart budget of a rank's sampler (and inference) processes.

    Args:
        worker_timeout_s: fail if no rollout arrives for this long; also how long a process may
            take to start (spawn, imports, building its envs) before its first heartbeat.
        max_worker_restarts: a sampler (or CPU inference worker) that dies without a traceback or
            hangs is restarted on the current weights, at most this many times per
            ``restart_window_s`` (0 = never); its round in flight is dropped.
        restart_window_s: the window, in seconds, over which ``max_worker_restarts`` counts.
        heartbeat_s: a started process that makes no progress (no env step, reset or wait) for
            this long is hung: it is killed and restarted as above.
        verify_weights_every: every this many policy versions, the trainer checks that each receiver
            holds the weights it published (a checksum; a mismatch stops the run,
            :class:`~fastlight.weights.checksum.DeliveryCheck`). 0 turns the check off.
    """

    worker_timeout_s: float = 300.0
    max_worker_restarts: int = 3
    restart_window_s: float = 600.0
    heartbeat_s: float = 60.0
    verify_weights_every: int = 1

    def __post_init__(self) -> None:
        for name in ("worker_timeout_s", "restart_window_s", "heartbeat_s"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{FLAG}.{name} must be > 0, got {value}")
        if self.max_worker_restarts < 0:
            raise ValueError(f"{FLAG}.max_worker_restarts must be >= 0, got {self.max_worker_restarts}")
        every = self.verify_weights_every
        if not isinstance(every, int) or isinstance(every, bool) or every < 0:
            raise ValueError(f"{FLAG}.verify_weights_every must be an integer >= 0 (0: off), got {every!r}")

    def delivery_check(self, *, keep: int) -> DeliveryCheck:
        """The trainer's check of ``verify_weights_every`` (``keep``: versions a Rollout may lag)."""
        return DeliveryCheck(self.verify_weights_every, keep=keep, setting=f"{FLAG}.verify_weights_every")


class SamplerError(RuntimeError):
    """A sampler process failed; the message names it and carries its traceback."""


def spend_restart(
    times: collections.deque[float], *, max_restarts: int, window_s: float, name: str, action: str,
    note: str | None = None,
) -> None:  # fmt: skip
    """The restart budget of every fleet: at most ``max_restarts`` in any ``window_s`` seconds. Takes
    one (appends to ``times``) and prints ``name`` and ``action``; raises :class:`SamplerError` naming
    ``name`` once the budget is spent. ``note`` ends the line."""
    tail = f"; {note}" if note else ""
    now = time.monotonic()
    while times and now - times[0] > window_s:
        times.popleft()
    budget = f"{FLAG}.max_worker_restarts {max_restarts} per {FLAG}.restart_window_s {window_s:g}"
    if len(times) >= max_restarts:
        raise SamplerError(
            f"{name}; restart budget exhausted: {len(times)} restarts in the last {window_s:g} s "
            f"({budget}){tail}"
        )
    times.append(now)
    print(
        f"fastlight: {name}; {action} ({len(times)} of {max_restarts} restarts in {window_s:g} s){tail}",
        file=sys.stderr,
        flush=True,
    )


def env_raised(payload: str) -> str | None:
    """The last line of a sampler's traceback (``EnvError: ...``) when an env's own exception ended the
    sampler, else None (such a sampler is restarted within the budget)."""
    lines = [line.strip() for line in payload.splitlines() if line.strip()]
    kind, sep, message = lines[-1].partition(": ") if lines else ("", "", "")
    return f"EnvError: {message}" if sep and kind.rsplit(".", 1)[-1] == "EnvError" else None


def crashed(index: int, payload: str) -> str:
    """Sampler ``index``'s own exception: its last line (e.g. which env raised, of which seed, at which
    step) on the first line, then the traceback it sent."""
    lines = [line for line in payload.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "no traceback"
    kind, sep, message = last.partition(": ")
    if sep and " " not in kind:  # "fastlight.sampling.collector.EnvError: ..." -> "EnvError: ..."
        last = f"{kind.rsplit('.', 1)[-1]}: {message}"
    return f"sampler worker {index} (fastlight-sampler-{index}) crashed: {last}\n{payload}"


def broken_pipe(payload: str) -> bool:
    """Whether a sampler's traceback is its pipe to the inference worker breaking (the worker died,
    or ended its loop on another sampler's EOF): a consequence of a fault, not a fault of its own."""
    return any(e in payload for e in ("EOFError", "ConnectionResetError", "BrokenPipeError"))
