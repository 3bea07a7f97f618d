"""``TimedCheckpoint``: a checkpoint every N minutes of training, kept, so a run can be compared over time;
and :class:`SaveClock`, the one clock (and rank agreement) every timed save of fastlight runs on.

Lightning's ``ModelCheckpoint(train_time_interval=...)`` never fires under manual optimisation, which
every fastlight module uses. This callback saves ``<dirpath>/time=<MMMM>min-step=<S>.ckpt`` each time
another ``every_minutes`` of training wall-clock has passed (a resumed run goes on counting from the
checkpoint's time) and once more when training ends. The ranks agree at an update's end
(:func:`max_over_ranks`): a save one rank's clock calls due is made by all, together.
"""

from __future__ import annotations

import os
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

#: The clock; a module attribute so tests can substitute a deterministic one.
_now = time.monotonic


class SaveClock:
    """Training wall-clock since ``start`` (plus ``offset_s``, a resumed run's earlier training), and
    whether a save is due: each time another ``every_minutes`` has passed (``None``: never)."""

    def __init__(self, every_minutes: float | None) -> None:
        self.every_s = None if every_minutes is None else 60.0 * every_minutes
        self.offset_s = 0.0
        self.intervals = 0  # intervals already saved for: the next save is due at (intervals + 1) x every
        self._start: float | None = None

    def start(self) -> None:
        self._start = _now()

    def elapsed_s(self) -> float:
        return self.offset_s + (0.0 if self._start is None else _now() - self._start)

    def due(self) -> bool:
        return self.every_s is not None and self.elapsed_s() >= (self.intervals + 1) * self.every_s

    def saved(self) -> None:
        """A save was made: the next one is due at the next multiple of ``every_minutes``."""
        if self.every_s is not None:
            self.intervals = int(self.elapsed_s() // self.every_s)


def max_over_ranks(trainer: pl.Trainer, *values: int) -> list[int]:
    """``values``' maximum over the ranks (one all-reduce; Lightning's ``reduce`` has a barrier first)."""
    if trainer.world_size == 1:
        return [int(v) for v in values]
    local = torch.tensor(values, device=trainer.strategy.root_device)
    return [int(v) for v in trainer.strategy.reduce(local, reduce_op="max").tolist()]


class TimedCheckpoint(Callback):
    """A kept checkpoint every ``every_minutes`` of training (see the module docstring).

    Args:
        every_minutes: training wall-clock between two checkpoints.
        dirpath: where to write them (default ``<trainer.default_root_dir>/checkpoints``).
    """

    def __init__(self, every_minutes: float = 10.0, dirpath: str | None = None) -> None:
        super().__init__()
        if every_minutes <= 0:
            raise ValueError(f"TimedCheckpoint every_minutes must be > 0, got {every_minutes}")
        self.every_minutes, self.dirpath = every_minutes, dirpath
        self.clock = SaveClock(every_minutes)
        self._last_step = -1

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.clock.start()

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if max_over_ranks(trainer, self.clock.due())[0]:
            self.clock.saved()
            self._save(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The state training ended in (e.g. at ``--trainer.max_time``), unless just saved."""
        if self._last_step != trainer.global_step:
            self._save(trainer)

    def _save(self, trainer: pl.Trainer) -> None:
        root = self.dirpath or os.path.join(trainer.default_root_dir, "checkpoints")
        name = f"time={int(self.clock.elapsed_s() // 60):04d}min-step={trainer.global_step}.ckpt"
        trainer.save_checkpoint(os.path.join(root, name), weights_only=False)
        self._last_step = trainer.global_step

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"elapsed_s": self.clock.elapsed_s(), "saved": self.clock.intervals}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.clock.offset_s = float(state_dict.get("elapsed_s", 0.0))
        self.clock.intervals = int(state_dict.get("saved", 0))
