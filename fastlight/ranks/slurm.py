"""SLURM's requeue, run at the agreed stop once the checkpoint is on disk (Lightning runs it inside
its signal handler, which saves with a barrier there; see :mod:`fastlight.lightning_compat`)."""

from __future__ import annotations

import os
import re
import subprocess

import lightning as L

from fastlight.checkpoint_link import link_as
from fastlight.lightning_compat import hpc_save_path


def slurm_job_id() -> str | None:
    """The job to requeue, as Lightning's SLURM handler finds it (an array task is ``<array>_<task>``)."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ.get("SLURM_JOB_ID")
    return job if job and re.fullmatch(r"[0-9_-]+", job) else None


def slurm_requeue(trainer: L.Trainer, ckpt_path: str) -> str:
    """Requeue this SLURM job to resume from ``ckpt_path`` (rank 0); returns what was done, for the stop
    line. Lightning resumes a requeued job only from ``hpc_ckpt_N.ckpt``, so ``ckpt_path`` gets that name
    too (a hard link; a copy where the filesystem has no links)."""
    hpc = hpc_save_path(trainer)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(hpc)), exist_ok=True)
        link_as(ckpt_path, hpc)
    except OSError as e:
        return f"not requeued: linking the checkpoint as {hpc} failed ({e.strerror or e})"
    if (job := slurm_job_id()) is None:
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
