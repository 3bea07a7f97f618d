"""What every fleet (:class:`~fastlight.fleet.base.SamplerFleet`: the local pool, the Ray fleet) says and
counts when a sampler fails: the error, the restart budget, and how a crash is reported."""

from __future__ import annotations

import collections
import sys
import time

from fastlight.fleet.faults import FLAG


class SamplerError(RuntimeError):
    """A sampler process failed; the message names it and carries its traceback."""


def spend_restart(
    times: collections.deque[float], *, max_restarts: int, window_s: float, name: str, action: str,
    note: str | None = None,
) -> None:  # fmt: skip
    """The restart budget of every fleet: at most ``max_restarts`` (``--data.faults.max_worker_restarts``)
    in any ``window_s`` seconds (``restart_window_s``). Takes one (appends to ``times``, the past
    restarts' clock times) and prints what is restarted, ``action``; raises :class:`SamplerError`
    naming ``name`` once the budget is spent. ``note`` (what a signal exit code means) ends the line."""
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
