"""How the local pool reads its child processes: dead (its exit code and, for a SIGKILL, the memory it
last held) or silent (its :class:`~fastlight.procs.Liveness`); and the forkserver that forked them.
When the forkserver dies, all of them read as dead with exit code 255 at once: one fault, named as
the forkserver, which stops the run (a forkserver is not restarted).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any, Protocol

from fastlight.fleet.faults import SamplerError
from fastlight.procs import Liveness, MemorySample, alive, exit_note, sample_memory, state

#: How long a child's exit code 255 waits for its forkserver to read as dead (its pipe closes first).
FORKSERVER_EXIT_S = 1.0


class Watched(Protocol):
    """A child process as the pool watches it."""

    proc: Any  # its multiprocessing Process
    liveness: Liveness  # the heartbeat it beats on progress
    #: Its resident memory at the last watch: what an OOM-killed process held.
    memory: MemorySample | None


def process_fault(child: Watched, now: float) -> tuple[str, str | None] | None:
    """What is wrong with ``child`` (dead, or silent past its heartbeat limits) and what its exit
    code means; None while it runs and makes progress (its memory is sampled then)."""
    if (code := child.proc.exitcode) is not None:
        return f"died with exit code {code}", exit_note(code, child.memory, now)
    child.memory = sample_memory(child.proc.pid) or child.memory
    hung = child.liveness.hang(now)  # until its first beat the child is starting: worker_timeout_s
    return None if hung is None else (hung, None)


def check_forkserver(pid: int | None, samplers: list[Any], worker: Any = None, wait_s: float = 0.0) -> None:
    """Raise :class:`SamplerError` naming the forkserver ``pid`` (None: the children were spawned)
    if it died, after killing what it forked (the ``samplers``' and the ``worker``'s processes) that
    still runs. ``wait_s``: how long to wait for it to read as dead (after a child's exit code 255)."""
    if pid is None:
        return
    deadline = time.monotonic() + wait_s
    while not _exited(pid):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)
    forked = f"the {len(samplers)} samplers it forked (pids {', '.join(str(p.pid) for p in samplers)})"
    if worker is not None:
        forked = f"the inference worker (pid {worker.pid}) and {forked}"
    _kill_forked([*samplers, worker])
    raise SamplerError(
        f"the forkserver (pid {pid}) died, and with it {forked}; a dead forkserver is not restarted"
    )


def _exited(pid: int) -> bool:
    """Whether process ``pid`` (this process's child) exited: a zombie counts, and so does a pid already
    reaped."""
    if state(pid) == "Z":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _kill_forked(procs: list[Any]) -> None:
    """SIGKILL the processes of a dead forkserver that still run (``Process.kill`` would skip them: their
    exit code 255 came from the server's closed status pipe)."""
    for proc in procs:
        if proc is not None and proc.pid is not None and alive(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
