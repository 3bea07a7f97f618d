"""The Lightning side of a coordinated stop: fastlight's stop-signal handler installed through
Lightning's own signal connector, SLURM's requeue, and the launcher's child-process observer.

Lightning's ``_SignalConnector`` installs, for SIGTERM, ``_sigterm_notifier_fn``, which forwards the
signal to the ranks the launcher started and then enters ``dist.broadcast`` from inside the signal
handler, on whatever rank received it. A rank other than 0 thus blocks in a broadcast that rank 0,
busy in the update's all-reduce, never joins: the job deadlocks (and every later signal is handled
in the same broadcast). Under SLURM with auto-requeue it also saves a checkpoint (a barrier) from
the SIGUSR1 handler. :class:`StopSignalConnector` keeps Lightning's connector (its record and
restore of the process's handlers, its SLURM environment and requeue signal) and registers one
handler instead, for SIGTERM, SIGINT, SIGUSR1 and SLURM's requeue signal, that enters no collective:
:class:`~fastlight.callbacks.preemption.PreemptionCheckpoint`'s, which notes the signal; the ranks
agree at the next update boundary. ``trainer.received_sigterm`` stays False, so Lightning's loops
(their per-batch broadcast from rank 0, their local ``SIGTERMException``) never stop one rank alone.

The rest is what the stop does once agreed: :func:`slurm_requeue` (rank 0, once the checkpoint is
on disk: the checkpoint under Lightning's ``hpc_ckpt_N.ckpt`` name, which a requeued job resumes
from, then ``scontrol requeue``, as Lightning's own SLURM handler does), and
:func:`stand_down_child_observer` / :func:`wait_for_ranks` (rank 0 of a run whose launcher started the
other ranks: Lightning's observer SIGKILLs rank 0 as soon as another rank exits non-zero, which a
stopping rank does on purpose, with 128 + signum).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

from fastlight.procs import STOP_SIGNALS

Handler = Callable[[int, FrameType | None], Any]


def slurm_requeue_signal(trainer: L.Trainer) -> int | None:
    """The requeue signal of a SLURM run with auto-requeue (Lightning's default: SIGUSR1), else None."""
    env = trainer._accelerator_connector.cluster_environment
    if isinstance(env, SLURMEnvironment) and env.auto_requeue and env.requeue_signal is not None:
        return int(env.requeue_signal)
    return None


class StopSignalConnector(_SignalConnector):
    """Lightning's signal connector with one handler, ``handler``, for every stop signal.

    ``register_signal_handlers`` records the process's handlers (Lightning's ``teardown`` puts them
    back when the fit ends, an interrupted one included) and installs ``handler``. It is called
    once by the callback's ``setup``, so a signal during the rest of the setup is handled too;
    Lightning's own call, later in ``fit``, then changes nothing.
    """

    def __init__(self, trainer: L.Trainer, handler: Handler) -> None:
        super().__init__(trainer)
        self.handler = handler
        self.registered = False

    def signals(self) -> tuple[int, ...]:
        requeue = slurm_requeue_signal(self.trainer)
        return tuple(dict.fromkeys((*STOP_SIGNALS, *([requeue] if requeue is not None else []))))

    def register_signal_handlers(self) -> None:
        if self.registered:
            return
        self.received_sigterm = False
        self._original_handlers = self._get_current_signal_handlers()
        for sig in self.signals():
            self._register_signal(sig, self.handler)
        self.registered = True

    def teardown(self) -> None:
        super().teardown()
        self.registered = False


def install(trainer: L.Trainer, handler: Handler) -> StopSignalConnector:
    """Put a :class:`StopSignalConnector` in Lightning's place for this fit and register it now."""
    connector = StopSignalConnector(trainer, handler)
    trainer._signal_connector = connector
    connector.register_signal_handlers()
    return connector


def slurm_job_id() -> str | None:
    """The job to requeue, as Lightning's SLURM handler finds it (an array task is ``<array>_<task>``)."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ.get("SLURM_JOB_ID")
    return job if job and re.fullmatch(r"[0-9_-]+", job) else None


def slurm_requeue(trainer: L.Trainer, ckpt_path: str) -> str:
    """Requeue this SLURM job to resume from ``ckpt_path`` (rank 0, the checkpoint on disk); returns
    what was done, for the stop line.

    The requeued job runs the same command; Lightning resumes it from the newest
    ``<default_root_dir>/hpc_ckpt_N.ckpt`` when no ``--ckpt_path`` is given (it looks for no other
    name), so ``ckpt_path`` gets that name too: a hard link, no second copy (a copy where the
    filesystem has no links).
    """
    hpc = trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(hpc)), exist_ok=True)
        try:
            os.link(ckpt_path, hpc)
        except OSError:
            shutil.copyfile(ckpt_path, hpc)
    except OSError as e:
        return f"not requeued: linking the checkpoint as {hpc} failed ({e.strerror or e})"
    job = slurm_job_id()
    if job is None:
        return f"not requeued: no SLURM_JOB_ID (the checkpoint is also {hpc})"
    cmd = ["scontrol", "requeue", job]
    try:
        result = subprocess.call(cmd)
    except FileNotFoundError:  # scontrol not on this PATH: Lightning retries through a shell
        result = subprocess.call(" ".join(cmd), shell=True)
    if result != 0:
        return (
            f"requeuing SLURM job {job} failed (`{' '.join(cmd)}` exited {result}); the checkpoint is {hpc}"
        )
    return f"requeued SLURM job {job}; it resumes from {hpc}"


def launched_ranks(trainer: L.Trainer) -> list[subprocess.Popen]:
    """The ranks this process started (Lightning's script launcher on a node's local rank 0)."""
    launcher = trainer.strategy.launcher
    return list(launcher.procs) if isinstance(launcher, _SubprocessScriptLauncher) else []


def stand_down_child_observer(trainer: L.Trainer) -> None:
    """Stop Lightning's observer of the launched ranks from SIGKILLing this process when they exit
    with 128 + signum as agreed; :func:`wait_for_ranks` takes its place. (It polls every 5 s, and
    ends at its next poll once it watches nothing.)"""
    launcher = trainer.strategy.launcher
    if not isinstance(launcher, _SubprocessScriptLauncher) or not launcher.procs:
        return
    for thread in threading.enumerate():
        # The observer was given the launcher's own list of processes.
        if isinstance(thread, _ChildProcessObserver) and thread._child_processes is launcher.procs:
            thread._child_processes = []


def wait_for_ranks(trainer: L.Trainer, timeout: float) -> list[int | None]:
    """Wait up to ``timeout`` s for the launched ranks to exit (SIGKILL those still running then), so
    that none outlives the process that started it; returns their exit codes."""
    ranks = launched_ranks(trainer)
    deadline = time.monotonic() + timeout
    for proc in ranks:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in ranks:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
    return [proc.returncode for proc in ranks]
