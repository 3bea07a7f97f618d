"""The processes that start ranks: a rank ends with its launcher, a launcher waits for its ranks."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping

import lightning as L

from fastlight.lightning_compat import launched_ranks

#: How long rank 0 waits for the ranks it launched to exit after a stop, before it SIGKILLs them.
RANKS_EXIT_TIMEOUT_S = 30.0


def launched_rank(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a rank a launcher started and waits for: torchrun's agent, or Lightning's
    script launcher (a ``LOCAL_RANK`` above 0 outside SLURM, whose ``srun`` starts every task itself)."""
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env:
        return True
    try:
        local = int(env.get("LOCAL_RANK", "0"))
    except ValueError:
        return False
    return local > 0 and "SLURM_JOB_ID" not in env


def stop_with_launcher(environ: Mapping[str, str] | None = None) -> bool:
    """In a launched rank, ask the kernel for SIGTERM when the launcher dies; returns whether it did."""
    if not sys.platform.startswith("linux") or not launched_rank(environ):
        return False
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return False
    if os.getppid() == 1:  # the launcher died before the request: nothing would ever send it
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def end_launched_ranks(
    trainer: L.Trainer, *, lost: Collection[int] = (), timeout: float = RANKS_EXIT_TIMEOUT_S
) -> str:
    """After a stop, in the process that launched ranks: SIGKILL the ``lost`` ones, wait up to ``timeout``
    s for the others (then SIGKILL them), and return the stop line's account of how they ended ("" where
    this process launched none)."""
    ranks = launched_ranks(trainer)
    for i, proc in enumerate(ranks):  # the launcher starts the node's next global ranks, in order
        if trainer.global_rank + i + 1 in lost and proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + timeout
    for proc in ranks:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    late = [proc for proc in ranks if proc.poll() is None]
    for proc in late:
        proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
    if not ranks:
        return ""
    note = "; the ranks it launched exited " + ", ".join(str(proc.returncode) for proc in ranks)
    return note + (f" (-9: killed, still running {timeout:g} s after the stop)" if late else "")
