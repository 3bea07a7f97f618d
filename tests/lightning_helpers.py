"""Shared test helpers: a quiet CPU Trainer and a check that no child process survived."""

from __future__ import annotations

import multiprocessing
import time

import lightning as L


def quiet_trainer(**kw) -> L.Trainer:
    return L.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        **kw,
    )


def wait_no_children(timeout: float = 10.0) -> None:
    """Every spawned child of this process has exited (reaped) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert multiprocessing.active_children() == []
