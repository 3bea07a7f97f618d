"""``TimedCheckpoint``: a checkpoint every N minutes of training, kept, so a run can be compared over time.

Lightning's ``ModelCheckpoint(train_time_interval=...)`` never fires under manual optimisation
(Lightning 2.6 checks only ``every_n_train_steps`` there), and every fastlight module optimises
manually. This callback saves ``<dirpath>/time=<MMMM>min-step=<S>.ckpt`` each time another
``every_minutes`` of training wall-clock has passed (measured from the start of ``fit``; a resumed
run goes on counting from the checkpoint's time) and once more when training ends, through
``trainer.save_checkpoint``, so it works under every strategy. The decision is rank 0's, broadcast,
so all ranks save together.
"""

from __future__ import annotations

import os
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


def _now() -> float:
    return time.monotonic()


class TimedCheckpoint(Callback):
    """A kept checkpoint every ``every_minutes`` of training (see the module docstring).

    Args:
        every_minutes: training wall-clock between two checkpoints.
        dirpath: where to write them (default ``<trainer.default_root_dir>/checkpoints``; the
            ``fastlight`` CLI puts them in the run's ``checkpoints/version_N``).
    """

    def __init__(self, every_minutes: float = 10.0, dirpath: str | None = None) -> None:
        super().__init__()
        if every_minutes <= 0:
            raise ValueError(f"TimedCheckpoint every_minutes must be > 0, got {every_minutes}")
        self.every_minutes, self.dirpath = every_minutes, dirpath
        self._offset_s = 0.0  # training time before this fit (a resumed run)
        self._start: float | None = None
        self._saved = 0  # checkpoints written so far (the next is due at (saved + 1) x every)
        self._last_step = -1

    def elapsed_s(self) -> float:
        return self._offset_s + (0.0 if self._start is None else _now() - self._start)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = _now()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        elapsed = self.elapsed_s()
        due = trainer.strategy.broadcast(elapsed >= (self._saved + 1) * self.every_minutes * 60.0)
        if not due:
            return
        self._saved = int(elapsed // (self.every_minutes * 60.0))
        self._save(trainer, elapsed)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The state training ended in (e.g. at ``--trainer.max_time``), unless just saved."""
        if self._last_step != trainer.global_step:
            self._save(trainer, self.elapsed_s())

    def _save(self, trainer: pl.Trainer, elapsed: float) -> None:
        root = self.dirpath or os.path.join(trainer.default_root_dir, "checkpoints")
        name = f"time={int(elapsed // 60):04d}min-step={trainer.global_step}.ckpt"
        trainer.save_checkpoint(os.path.join(root, name), weights_only=False)
        self._last_step = trainer.global_step

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"elapsed_s": self.elapsed_s(), "saved": self._saved}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset_s = float(state_dict.get("elapsed_s", 0.0))
        self._saved = int(state_dict.get("saved", 0))
