"""Process helpers every fastlight process shares: what a child does first (die with its trainer,
ignore the stop signals, seed, limit threads), the shared stop flag and lock, the children's heartbeat
(:class:`Liveness`), and the readers of Linux's ``/proc`` it needs.

Used by the sampler processes (:mod:`fastlight.sampling.worker`), their pool
(:mod:`fastlight.fleet.pool`), the inference worker and its client (:mod:`fastlight.inference`) and
the shared weights (:mod:`fastlight.weights.shared_memory`). Processes start with the spawn context
(or the forkserver the CLI warms) and get their seed from the trainer (DESIGN: processes), so a run
is reproducible and no child outlives it.

This module is the ground floor: it imports nothing from fastlight.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

#: The signals that stop a run (with a checkpoint): Ctrl-C, the scheduler's SIGTERM, SLURM's usual
#: requeue signal. The trainer handles them; its children ignore them (:func:`start_child`).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def start_child(parent_pid: int, *, seed: int | None = None, threads: int | None = None) -> None:
    """Call first in a spawned child: :func:`die_with_parent`, then seeding and the thread count.

    The stop signals are ignored: a Ctrl-C in a terminal reaches the whole process group, and so
    do ``kill -TERM -PGID`` and SLURM's ``scancel`` (which signals every process of the job). The
    trainer handles them (all its ranks agree on the update to stop after, one checkpoint, then it
    stops its children); a child that died of one would be restarted by the pool while the trainer
    stops, and one that raised KeyboardInterrupt would print a traceback and look like a crash.
    (The pool also starts children with them ignored, which covers their start-up, before this runs.)
    The trainer stops a child through the pool's stop flag, then SIGKILL.
    """
    ignore_stop_signals()
    die_with_parent(parent_pid)
    if threads is not None:
        torch.set_num_threads(threads)
    if seed is not None:
        seed_everything(seed)


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity mask (a container's, ``taskset``'s or
    SLURM's limit), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def spare_threads(*, cores: int, ranks: int, busy: int) -> int:
    """Intra-op threads for a process that shares ``cores`` with ``ranks - 1`` other trainer ranks
    and, per rank, ``busy`` single-threaded processes that compute all the time (samplers): the
    cores left over, at least 1. More threads than free cores make OpenMP's workers wait on
    preempted peers at every parallel region."""
    return max(1, cores // max(1, ranks) - busy)


def ignore_stop_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        # Started from a trainer's thread, a child inherits them blocked (children_ignore_stop_signals):
        # ignored now, they need not stay blocked (a blocked mask would pass on to its own children).
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def children_ignore_stop_signals() -> Iterator[None]:
    """Start processes inside this block to have them ignore the stop signals from their first
    instruction: an ignored disposition survives fork and exec, and Python then installs no
    KeyboardInterrupt handler. The trainer's own handlers are back when the block ends.

    Outside the main thread (a sampler restarted by the prefetch thread), where Python cannot set a
    disposition, the signals are blocked in this thread instead: a child inherits the calling
    thread's mask through fork and exec, so none is delivered to it before :func:`start_child`
    ignores them; the trainer's other threads still receive them (its main thread handles them)."""
    if threading.current_thread() is not threading.main_thread():
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python


def die_with_parent(parent: int) -> None:
    """Exit when the trainer (pid ``parent``) dies: the kernel's PR_SET_PDEATHSIG on Linux, plus
    a watchdog thread. ``parent`` is passed in rather than read here, because the trainer may
    die while this process is still importing, before this function runs.

    A child forked by the trainer's forkserver (:mod:`fastlight.fleet.start`) has the
    forkserver as its parent, itself the trainer's child. The forkserver does not exit with the
    trainer on its own: it waits until every process holding its "alive" pipe is gone, and its
    children hold that pipe too. So such a child also watches the forkserver's parent, and exits
    once that is no longer the trainer; the forkserver follows when its last child is gone."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    direct = os.getppid()
    via_server = direct != parent
    if via_server and parent_pid(direct) != parent:
        os._exit(1)

    def watchdog() -> None:
        while True:
            if os.getppid() != direct or (via_server and parent_pid(direct) != parent):
                os._exit(1)
            time.sleep(1.0)

    threading.Thread(target=watchdog, daemon=True, name="fastlight-parent-watchdog").start()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class StopFlag:
    """A stop request shared with child processes, read without a lock.

    ``multiprocessing.Event.is_set`` takes a lock shared by every process: a child killed or
    SIGSTOPped inside it (samplers poll it in their loops) would block the trainer's ``set()``
    forever. A single shared byte cannot be left locked.
    """

    def __init__(self, ctx: Any) -> None:
        self._flag = ctx.Value("b", 0, lock=False)

    def set(self) -> None:
        self._flag.value = 1

    def is_set(self) -> bool:
        return bool(self._flag.value)


class OwnedLock:
    """A process-shared lock that remembers which pid holds it, so that the trainer can free it
    when it kills that process (a restarted sampler must not leave the weights locked forever).

    The holder's pid is written right after acquiring and cleared right before releasing; a
    process killed between those instructions and the lock calls themselves is the only gap.
    """

    def __init__(self, ctx: Any) -> None:
        self._lock = ctx.Lock()
        self._holder = ctx.Value("i", 0, lock=False)

    def __enter__(self) -> OwnedLock:
        self._lock.acquire()
        self._holder.value = os.getpid()
        return self

    def __exit__(self, *exc: object) -> None:
        self._holder.value = 0
        self._lock.release()

    def release_if_held_by(self, pid: int) -> bool:
        """Release the lock if the (dead) process ``pid`` holds it; True if it did."""
        if pid and self._holder.value == pid:
            self._holder.value = 0
            self._lock.release()  # a multiprocessing Lock is a semaphore: any process may release it
            return True
        return False


@dataclass(frozen=True)
class HeartbeatLimits:
    """How long a child may be silent, and the flags that set it (error messages name them).

    A child that has beaten at least once may be silent for ``heartbeat_s``; until its first beat
    (spawn, imports, building envs) it gets ``max(heartbeat_s, start_timeout_s)``. The defaults
    (infinite) never count a child as hung.
    """

    heartbeat_s: float = float("inf")
    start_timeout_s: float = float("inf")
    heartbeat_flag: str = "heartbeat_s"
    start_flag: str = "start_timeout_s"


class Liveness:
    """A child process's heartbeat, both ends: the child calls :meth:`beat` on every sign of progress
    (an env step, a reset, a turn of a wait loop), the trainer calls :meth:`hang` and restarts or
    names a child whose counter stood still too long (Sample Factory's habit; DESIGN: a silent hang
    is never acceptable).

    The counter lives in shared memory (``ctx.Value("Q", lock=False)``); the trainer only looks for a
    change, so neither clocks nor atomic increments matter, and a child killed mid-increment leaves
    nothing locked. The object is passed to the child as a ``Process`` argument; the watching state
    (last value seen and when, on the trainer's monotonic clock) is the trainer's copy.

    Timeout rule: :class:`HeartbeatLimits`. Silence is measured from the last time a watcher saw the
    counter move (or from :meth:`reset`, called right after the child starts), so a hang is detected
    one watch interval after the limit at the latest.

    Where the child shares no memory with the watcher (a Ray actor on another node), ``ctx`` is None:
    the counter is the watcher's own, set by :meth:`report` from the count the child sends, and the
    same rule applies (a child that stops answering stops moving it too).
    """

    def __init__(self, ctx: Any | None, limits: HeartbeatLimits | None = None) -> None:
        self.counter = ctx.Value("Q", 0, lock=False) if ctx is not None else types.SimpleNamespace(value=0)
        self.limits = limits or HeartbeatLimits()
        self._seen, self._seen_at = 0, time.monotonic()

    def beat(self) -> None:
        """The child's side: one sign of progress."""
        self.counter.value += 1

    def report(self, beats: int) -> None:
        """The watcher's side without shared memory: the child's beat count as it last sent it."""
        self.counter.value = beats

    def reset(self, *, restart: bool = False) -> None:
        """Start watching now (call right after starting the child); ``restart`` also zeroes the
        counter, so a child started again on the same counter is held to the start-up limit."""
        if restart:
            self.counter.value = 0
        self._seen, self._seen_at = self.counter.value, time.monotonic()

    @property
    def started(self) -> bool:
        """Whether the watcher has seen the child beat at least once."""
        return self._seen > 0

    def silent_for(self, now: float | None = None) -> float:
        """Seconds since the counter last moved, as seen by the calls to this (``now``: monotonic)."""
        now = time.monotonic() if now is None else now
        beats = self.counter.value
        if beats != self._seen:
            self._seen, self._seen_at = beats, now
        return now - self._seen_at

    def hang(self, now: float | None = None) -> str | None:
        """What is wrong if the child made no progress for longer than allowed, else None, e.g.
        ``"made no progress for 5.3 s (--data.faults.heartbeat_s 5)"``."""
        silent, started, lim = self.silent_for(now), self.started, self.limits
        limit = lim.heartbeat_s if started else max(lim.heartbeat_s, lim.start_timeout_s)
        if silent <= limit:
            return None
        flag = lim.heartbeat_flag if started else f"{lim.start_flag}, while starting"
        return f"made no progress for {silent:.1f} s ({flag} {limit:g})"


# --- Linux /proc readers: every function returns None / False / empty where /proc cannot be read.


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after ``(comm)`` (a command name may hold spaces and
    parentheses): ``[0]`` state, ``[1]`` ppid, ``[11]`` utime, ``[12]`` stime, ``[19]`` starttime."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def parent_pid(pid: int) -> int | None:
    """The parent of process ``pid`` from ``/proc`` (Linux), or None where unreadable."""
    fields = stat_fields(pid)
    try:
        return int(fields[1]) if fields else None
    except (ValueError, IndexError):
        return None


def state(pid: int) -> str | None:
    """Process ``pid``'s one-letter state (``R``, ``S``, ``T`` stopped, ``Z`` zombie...), None if gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (dead, not yet reaped)."""
    return state(pid) not in (None, "Z")


@dataclass(frozen=True)
class MemorySample:
    """A process's resident memory as last seen (``/proc/<pid>/status``): now and at its peak, in MiB,
    and when it was read (``time.monotonic()``)."""

    rss_mib: float
    peak_mib: float
    at: float


def sample_memory(pid: int) -> MemorySample | None:
    """``VmRSS`` and ``VmHWM`` of process ``pid`` (one small read: cheap enough for a watch loop);
    None where unreadable (gone, a zombie, no ``/proc``)."""
    rss = peak = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    if rss is None:  # a zombie keeps its status file but no memory lines
        return None
    return MemorySample(rss, rss if peak is None else peak, time.monotonic())


def format_mib(mib: float) -> str:
    return f"{mib:.0f} MiB" if mib < 1024 else f"{mib / 1024:.2f} GiB"


def exit_note(code: int | None, memory: MemorySample | None = None, now: float | None = None) -> str | None:
    """What a dead child's exit code says beyond the number, or None for a normal exit code: the
    signal that killed it (multiprocessing reports a signal ``N`` as exit code ``-N``) and, for
    SIGKILL, its last resident memory seen (``memory``, from :func:`sample_memory`), since the
    kernel's OOM killer kills with SIGKILL and leaves no other trace in the process."""
    if code is None or code >= 0:
        return None
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if -code != signal.SIGKILL:
        return f"exit code {code} is {name}"
    if memory is None:
        seen = "its memory was never read"
    else:
        age = (time.monotonic() if now is None else now) - memory.at
        seen = (
            f"it held {format_mib(memory.rss_mib)} resident (peak {format_mib(memory.peak_mib)}) "
            f"{age:.1f} s before"
        )
    return (
        f"exit code {code} is SIGKILL, which the kernel's OOM killer sends when memory runs out: {seen}; "
        "`dmesg | grep -i 'killed process'` (or `journalctl -k`) shows whether it did"
    )
