"""Process helpers every fastlight process shares: what a child does first (die with its trainer,
ignore the stop signals, seed, limit threads), the shared stop flag and lock, the children's heartbeat
(:class:`Liveness`), and the readers of Linux's ``/proc`` it needs. It imports nothing from fastlight.
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
    """Call first in a spawned child: ignore the stop signals, :func:`die_with_parent`, then seeding and
    the thread count. A Ctrl-C or ``scancel`` reaches every process of the job; the trainer handles it
    and stops its children (through the pool's stop flag, then SIGKILL)."""
    ignore_stop_signals()
    die_with_parent(parent_pid)
    if threads is not None:
        torch.set_num_threads(threads)
    if seed is not None:
        seed_everything(seed)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def spare_threads(*, cores: int, ranks: int, busy: int) -> int:
    """Intra-op threads for a process that shares ``cores`` with ``ranks - 1`` other trainer ranks and,
    per rank, ``busy`` single-threaded busy processes (samplers): the cores left over, at least 1."""
    return max(1, cores // max(1, ranks) - busy)


def ignore_stop_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        # A child started from a trainer's thread inherits them blocked: ignored now, they need not be.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def children_ignore_stop_signals() -> Iterator[None]:
    """Processes started inside this block ignore the stop signals from their first instruction (an
    ignored disposition survives fork and exec). Outside the main thread, where Python cannot set a
    disposition, the signals are blocked in this thread instead (a child inherits the mask) until
    :func:`start_child` ignores them."""
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
    """Exit when the trainer (pid ``parent``, passed in: it may die while this child imports) dies: the
    kernel's PR_SET_PDEATHSIG on Linux, plus a watchdog thread. A child of the trainer's forkserver also
    watches the forkserver's parent (the forkserver does not exit with the trainer while children live)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
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
    """A stop request shared with child processes, read without a lock (a child killed inside
    ``multiprocessing.Event.is_set`` would leave its lock held; a shared byte cannot be)."""

    def __init__(self, ctx: Any) -> None:
        self._flag = ctx.Value("b", 0, lock=False)

    def set(self) -> None:
        self._flag.value = 1

    def is_set(self) -> bool:
        return bool(self._flag.value)


class OwnedLock:
    """A process-shared lock that remembers which pid holds it, so that the trainer can free it when it
    kills that process (a process killed between the lock call and the pid write is the only gap)."""

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
    """How long a child may be silent (``heartbeat_s``; before its first beat ``max(heartbeat_s,
    start_timeout_s)``; infinite by default), and the flags that set it (error messages name them)."""

    heartbeat_s: float = float("inf")
    start_timeout_s: float = float("inf")
    heartbeat_flag: str = "heartbeat_s"
    start_flag: str = "start_timeout_s"


class Liveness:
    """A child process's heartbeat, both ends: the child calls :meth:`beat` on every sign of progress,
    the trainer calls :meth:`hang` and restarts or names a child whose counter stood still too long.
    The counter is shared memory without a lock (a child killed mid-increment leaves nothing locked);
    silence counts from the last move a watcher saw (or :meth:`reset`), against :class:`HeartbeatLimits`.
    With ``ctx`` None (a Ray actor on another node) the counter is the watcher's own (:meth:`report`)."""

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
        """Start watching now (right after starting the child); ``restart`` also zeroes the counter."""
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
    """The fields of ``/proc/<pid>/stat`` after ``(comm)``: ``[0]`` state, ``[1]`` ppid, ``[11]`` utime,
    ``[12]`` stime, ``[19]`` starttime."""
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
    """A process's resident memory (now and peak, MiB) and when it was read (``time.monotonic()``)."""

    rss_mib: float
    peak_mib: float
    at: float


def sample_memory(pid: int) -> MemorySample | None:
    """``VmRSS`` and ``VmHWM`` of process ``pid``; None where unreadable (gone, a zombie, no ``/proc``)."""
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
    """What a dead child's exit code says beyond the number, or None for a normal exit: the signal that
    killed it and, for SIGKILL (the OOM killer's), its last resident memory seen (``memory``)."""
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
        rss, peak = format_mib(memory.rss_mib), format_mib(memory.peak_mib)
        seen = f"it held {rss} resident (peak {peak}) {age:.1f} s before"
    return (
        f"exit code {code} is SIGKILL, which the kernel's OOM killer sends when memory runs out: {seen}; "
        "`dmesg | grep -i 'killed process'` (or `journalctl -k`) shows whether it did"
    )
