"""``WeightSync``: AcceRL's inference drain, and the ``sync/*`` metrics of every publish.

With ``drain: true`` this callback tells the inference worker *before the last optimizer step of the
update* to finish its in-flight forward pass, schedule no new one, and wait in the weight broadcast
(AcceRL §inference drain), so the publish finds it ready; ``drain: false`` is the baseline.

Logged per publish (:class:`~fastlight.weights.publisher.SyncStats`): ``sync/trainer_wait_ms``,
``sync/latency_ms``, ``sync/bytes``, ``sync/collectives``, ``sync/version``, and ``sync/verified``: the
receivers found holding exactly the published weights since the fit began
(:class:`~fastlight.weights.checksum.DeliveryCheck`; not logged when ``verify_weights_every`` is 0).
Needs a :class:`~fastlight.data.protocols.WeightPublishing` DataModule and a
:class:`~fastlight.data.protocols.TrainsPolicy` module (else it stops the run at ``on_fit_start``).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from fastlight.data.protocols import ChecksDelivery, TrainsPolicy, WeightPublishing, require
from fastlight.lightning_compat import log_once


class WeightSync(Callback):
    """AcceRL's inference drain, and the ``sync/*`` metrics of every publish (see the module docstring).

    Args:
        drain: signal the inference worker before the update's last optimizer step.
    """

    def __init__(self, drain: bool = True) -> None:
        super().__init__()
        self.drain, self.drains = drain, 0
        self._steps, self._logged = 0, -1

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After configure_model: the module's policy exists by now.
        require(trainer.datamodule, WeightPublishing, who="WeightSync", what="a DataModule")
        require(pl_module, TrainsPolicy, who="WeightSync", what="a LightningModule")

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        self._steps = 0
        # The DataModule published right before this batch was handed over: log that publish once.
        stats = trainer.datamodule.last_sync
        if stats is not None and stats.version != self._logged:
            self._logged = stats.version
            metrics = stats.metrics()
            delivery = trainer.datamodule.delivery if isinstance(trainer.datamodule, ChecksDelivery) else None
            if delivery is not None and delivery.every > 0:
                metrics["sync/verified"] = float(delivery.verified)
            log_once(trainer, metrics)

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        self._steps += 1
        if self.drain and self._steps == pl_module.optimizer_steps_per_update:
            trainer.datamodule.request_drain()
            self.drains += 1
