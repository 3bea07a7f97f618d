"""TimedCheckpoint: one kept checkpoint per interval of training time, also under manual optimisation."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

import fastlight.callbacks.timed_checkpoint as tc
from fastlight.callbacks.timed_checkpoint import TimedCheckpoint
from tests.lightning_helpers import quiet_trainer


class ManualBoring(BoringModel):
    """Manual optimisation, as every fastlight module: Lightning's own train_time_interval skips these."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.step(batch)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


class FakeClock(Callback):
    """A clock that only moves at each batch start, by 20 s: batch k (1-based) ends at 20 k s."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def on_train_batch_start(self, *args) -> None:
        self.t += 20.0


def test_saves_one_checkpoint_per_interval_under_manual_optimisation(tmp_path, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(tc, "_now", clock)
    cb = TimedCheckpoint(every_minutes=1.0)
    trainer = quiet_trainer(max_steps=10, default_root_dir=str(tmp_path), callbacks=[clock, cb])
    trainer.fit(ManualBoring())
    files = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    # 10 batches = 200 s of training: due at 60, 120, 180 s, i.e. after batches 3, 6, 9; then the end
    assert set(files) == {
        "time=0001min-step=3.ckpt", "time=0002min-step=6.ckpt", "time=0003min-step=9.ckpt",
        "time=0003min-step=10.ckpt",
    }  # fmt: skip
    ckpt = torch.load(tmp_path / "checkpoints" / "time=0003min-step=9.ckpt", weights_only=False)
    state = next(v for k, v in ckpt["callbacks"].items() if "TimedCheckpoint" in k)
    assert state == {"elapsed_s": 180.0, "saved": 3}


def test_resumed_counter_continues_and_bad_interval_is_refused():
    cb = TimedCheckpoint(every_minutes=2.0)
    cb.load_state_dict({"elapsed_s": 300.0, "saved": 2})
    assert cb.clock.elapsed_s() == 300.0 and cb.clock.intervals == 2  # next one due at 6 min, not at 2
    with pytest.raises(ValueError, match="every_minutes must be > 0"):
        TimedCheckpoint(every_minutes=0)
