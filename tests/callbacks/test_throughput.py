"""RolloutThroughput: logs FAST's throughput family on a real Trainer run over Rollout batches."""

from __future__ import annotations

import itertools

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

import fastlight.callbacks.throughput as throughput_cb
from fastlight.callbacks.throughput import RolloutThroughput
from fastlight.rollout import EpisodeRecord, Rollout, RolloutStats


def _rollout(raw: int, valid: int, *, step_time: float, wall_time: float, lengths: list[int]) -> Rollout:
    """A [raw, 1] rollout whose stats are what the monitor reads (tensors are placeholders)."""
    v = torch.zeros(raw, 1, dtype=torch.bool)
    v[:valid] = True
    done = torch.zeros(raw, 1, dtype=torch.bool)
    done[valid - 1] = True
    z, lz = torch.zeros(raw, 1), torch.zeros(raw, 1, dtype=torch.long)
    eps = [EpisodeRecord(length=n, ret=0.0, terminated=True, truncated=False) for n in lengths]
    stats = RolloutStats(raw_steps=raw, valid_steps=valid, step_time=step_time, wall_time=wall_time,
                         global_resets=1, episodes=eps)
    return Rollout(obs=torch.zeros(raw, 1, 2), actions=lz, logprobs=z, values=z, rewards=z, terminated=done,
                   truncated=torch.zeros_like(done), valid=v, step=lz, task_id=lz, policy_version=lz,
                   bootstrap_values=z, stats=stats).validate()


BATCHES = [
    _rollout(10, 10, step_time=9.0, wall_time=99.0, lengths=[10]),  # only starts the clock
    _rollout(8, 6, step_time=1.0, wall_time=2.0, lengths=[6]),
    _rollout(8, 4, step_time=1.0, wall_time=2.0, lengths=[2, 2]),
    _rollout(4, 4, step_time=0.5, wall_time=1.0, lengths=[4]),
]
CLOCK = [100.0, 102.0, 106.0, 107.0]  # trainer-side time at the end of each batch


class _TinyModule(pl.LightningModule):
    """Manual optimisation, like RLModule; the training step does nothing with the Rollout."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch: Rollout, batch_idx: int) -> None:
        assert isinstance(batch, Rollout)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(BATCHES, batch_size=None, collate_fn=lambda r: r)


def _fit(monitor: RolloutThroughput, monkeypatch: pytest.MonkeyPatch) -> pl.Trainer:
    ticks = itertools.chain(CLOCK, itertools.count(1000.0))
    monkeypatch.setattr(throughput_cb, "_now", lambda: next(ticks))
    trainer = pl.Trainer(max_epochs=1, callbacks=[monitor], logger=False, enable_checkpointing=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(_TinyModule())
    return trainer


def test_logs_each_batch_with_the_trainer_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _fit(RolloutThroughput(), monkeypatch)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # the last batch alone (window=1): 4 raw, 4 valid in 107 - 106 = 1 s of trainer clock
    assert m["perf/raw_tps"] == pytest.approx(4.0)
    assert m["perf/effective_tps"] == pytest.approx(4.0)
    assert m["perf/sample_efficiency"] == pytest.approx(1.0)
    assert m["perf/time_efficiency"] == pytest.approx(0.5)
    assert m["perf/per_sampler_tps"] == pytest.approx(4.0)
    assert m["perf/mean_episode_length"] == pytest.approx(4.0)
    assert m["perf/resets_per_1k_valid"] == pytest.approx(250.0)
    assert m["perf/truncated_episode_share"] == pytest.approx(0.0)
    assert m["perf/valid_steps_total"] == 24.0 and m["perf/raw_steps_total"] == 30.0
    assert "perf/effective_tps" in trainer.progress_bar_metrics


def test_window_aggregates_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _fit(RolloutThroughput(window=3), monkeypatch)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # batches 2-4 together: 20 raw, 14 valid over 107 - 100 = 7 s; samplers busy 5 s
    assert m["perf/raw_tps"] == pytest.approx(20 / 7)
    assert m["perf/effective_tps"] == pytest.approx(14 / 7)
    assert m["perf/sample_efficiency"] == pytest.approx(14 / 20)
    assert m["perf/time_efficiency"] == pytest.approx(2.5 / 5)
    assert m["perf/per_sampler_tps"] == pytest.approx(14 / 5)
    assert m["perf/mean_episode_length"] == pytest.approx((6 + 2 + 2 + 4) / 4)
    assert m["perf/resets_per_1k_valid"] == pytest.approx(1000 * 3 / 14)


def test_prog_bar_false_hides_effective_tps(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _fit(RolloutThroughput(prog_bar=False), monkeypatch)
    assert "perf/effective_tps" in trainer.callback_metrics
    assert "perf/effective_tps" not in trainer.progress_bar_metrics


def test_other_batches_without_counts_fn_warn_once_and_count_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monitor = RolloutThroughput()
    monkeypatch.setattr(throughput_cb, "_now", lambda: 0.0)
    match = r"batches are Tensor, not fastlight\.rollout\.Rollout.*batch_counts_fn"
    with pytest.warns(UserWarning, match=match) as record:
        for _ in range(3):
            monitor.on_train_batch_end(None, None, None, torch.zeros(3), 0)  # type: ignore[arg-type]
    assert len(record) == 1
    assert monitor.totals["raw_steps"] == 0 and monitor._last is None


def test_a_counts_fn_returning_something_else_is_refused() -> None:
    monitor = RolloutThroughput(batch_counts_fn=len)
    with pytest.raises(TypeError, match="batch_counts_fn must return .*RolloutStats, got int"):
        monitor.on_train_batch_end(None, None, None, torch.zeros(3), 0)  # type: ignore[arg-type]


def test_state_dict_round_trip_keeps_totals(monkeypatch: pytest.MonkeyPatch) -> None:
    monitor = RolloutThroughput()
    _fit(monitor, monkeypatch)
    state = monitor.state_dict()
    assert state["totals"] == {"raw_steps": 30, "valid_steps": 24, "episodes": 5, "global_resets": 4}
    resumed = RolloutThroughput()
    resumed.load_state_dict(state)
    assert resumed.totals == state["totals"]


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        RolloutThroughput(window=0)


def test_name_and_state_key_differ_from_lightnings_throughput_monitor() -> None:
    """Lightning's own ThroughputMonitor is keyed by its class name, "ThroughputMonitor"; ours is
    neither named nor keyed so, so the two never meet on the command line or in a checkpoint."""
    from lightning.pytorch.callbacks import ThroughputMonitor as LightningThroughputMonitor

    ours = RolloutThroughput()
    theirs = LightningThroughputMonitor(batch_size_fn=lambda batch: 1)
    assert theirs.state_key == "ThroughputMonitor"
    assert ours.state_key == "fastlight.RolloutThroughput" != theirs.state_key
    assert type(ours).__name__ != type(theirs).__name__
    assert not hasattr(throughput_cb, "ThroughputMonitor")  # the bare name on a command line is Lightning's

