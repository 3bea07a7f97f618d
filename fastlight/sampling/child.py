"""What every fastlight child process does first: die with its trainer, seed, limit threads.

Shared by the sampler processes (:mod:`fastlight.sampling.worker`) and the inference worker
(:mod:`fastlight.inference.server`). Processes start with the spawn context and get their seed
from the trainer (DESIGN: processes), so a run is reproducible and no child outlives it.
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
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def start_child(parent_pid: int, *, seed: int | None = None, threads: int | None = None) -> None:
    """Call first in a spawned child: :func:`die_with_parent`, then seeding and the thread count.

    SIGINT is ignored: a Ctrl-C in a terminal reaches the whole process group, and the trainer
    handles it (checkpoint, then it stops its children); a child that raised KeyboardInterrupt
    would print a traceback and look like a crash. (The pool also starts children with SIGINT
    ignored, which covers their start-up, before this runs.)
    """
    ignore_sigint()
    die_with_parent(parent_pid)
    if threads is not None:
        torch.set_num_threads(threads)
    if seed is not None:
        seed_everything(seed)


def ignore_sigint() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def children_ignore_sigint() -> Iterator[None]:
    """Start processes inside this block to have them ignore SIGINT from their first instruction:
    an ignored disposition survives fork and exec, and Python then installs no KeyboardInterrupt
    handler. The trainer's own handler is back when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def die_with_parent(parent: int) -> None:
    """Exit when the trainer (pid ``parent``) dies: the kernel's PR_SET_PDEATHSIG on Linux, plus
    a watchdog thread. ``parent`` is passed in rather than read here, because the trainer may
    die while this process is still importing, before this function runs.

    A child forked by the trainer's forkserver (:mod:`fastlight.sampling.start`) has the
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


def parent_pid(pid: int) -> int | None:
    """The parent of process ``pid`` from ``/proc`` (Linux), or None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat.rsplit(")", 1)[1].split()[1])  # fields after "(comm)": state, ppid, ...
    except (OSError, ValueError, IndexError):
        return None


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
