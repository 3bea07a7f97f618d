"""``WeightSync``: push new weights to the samplers right after each update (AcceRL §weight sync).

Without this callback the DataModule publishes the weights when the next batch is requested.
With it, they go out at the end of the update, and - with ``drain: true`` - the inference
worker is told *before the last optimizer step of the update* to finish its in-flight forward
pass, schedule no new one, and wait in the broadcast (AcceRL §inference drain). The trainer
then finds the worker ready instead of waiting for the tail of a forward pass.
``drain: false`` is the baseline: the signal goes out only when the update has ended.

Logged: ``sync/trainer_wait_ms`` (update end -> the trainer may go on, the broadcast
included), ``sync/latency_ms`` (the broadcast itself, as the sync group measured it; 0 for the
shared-memory path) and ``sync/version``.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch.optim import Optimizer
from typing_extensions import override


class WeightSync(Callback):
    """Args:
    drain: signal the inference worker before the update's last optimizer step.
    """

    def __init__(self, drain: bool = True) -> None:
        super().__init__()
        self.drain = drain
        self._steps = 0
        self.drains = 0

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._steps = 0

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        self._steps += 1
        per_update = getattr(pl_module, "optimizer_steps_per_update", None)
        if self.drain and per_update is not None and self._steps == per_update:
            request = getattr(trainer.datamodule, "request_drain", None)
            if request is not None:
                request()
                self.drains += 1

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        publish = getattr(trainer.datamodule, "publish", None)
        if publish is None:
            return
        t0 = time.perf_counter()
        if not publish(pl_module):
            return
        wait_ms = 1000.0 * (time.perf_counter() - t0)
        client = getattr(trainer.datamodule.pool, "client", None)
        latency = client.last_latency_ms if client is not None else wait_ms
        pl_module.log_dict(
            {
                "sync/trainer_wait_ms": wait_ms,
                "sync/latency_ms": latency,
                "sync/version": float(pl_module.policy_version),
            },
            on_step=True,
            on_epoch=False,
            batch_size=1,
        )
