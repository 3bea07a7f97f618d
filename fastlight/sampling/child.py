"""What every fastlight child process does first: die with its trainer, seed, limit threads.

Shared by the sampler processes (:mod:`fastlight.sampling.worker`) and the inference worker
(:mod:`fastlight.inference.server`). Processes start with the spawn context and get their seed
from the trainer (DESIGN: processes), so a run is reproducible and no child outlives it.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import sys
import threading
import time

import numpy as np
import torch


def start_child(parent_pid: int, *, seed: int | None = None, threads: int | None = None) -> None:
    """Call first in a spawned child: :func:`die_with_parent`, then seeding and the thread count."""
    die_with_parent(parent_pid)
    if threads is not None:
        torch.set_num_threads(threads)
    if seed is not None:
        seed_everything(seed)


def die_with_parent(parent: int) -> None:
    """Exit when the trainer (pid ``parent``) dies: the kernel's PR_SET_PDEATHSIG on Linux, plus
    a watchdog thread. ``parent`` is passed in rather than read here, because the trainer may
    die while this process is still importing, before this function runs."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    if os.getppid() != parent:
        os._exit(1)

    def watchdog() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(1.0)

    threading.Thread(target=watchdog, daemon=True, name="fastlight-parent-watchdog").start()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
