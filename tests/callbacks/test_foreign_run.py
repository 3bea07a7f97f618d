"""fastlight's callbacks on a plain Lightning project (tuples from an ``IterableDataset``, its own
DataModule): each either works through its small interface or says once what is missing."""

from __future__ import annotations

import itertools

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import fastlight.callbacks.throughput as throughput_cb
from fastlight.callbacks.dwr import DynamicWeightedResampling
from fastlight.callbacks.throughput import RolloutThroughput
from fastlight.rollout import RolloutStats
from tests.lightning_helpers import quiet_trainer

BATCH = 8


class Transitions(IterableDataset):
    """``(obs, action, old_logp, return, advantage)`` tuples, as Lightning's PPO template yields."""

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(4 * BATCH):
            obs = torch.randn(3, generator=g)
            yield obs, torch.tensor(0), torch.tensor(-0.7), torch.tensor(1.0), torch.tensor(0.1)


class PlainModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        obs, _, _, ret, _ = batch
        return (self.layer(obs).squeeze(-1) - ret).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(Transitions(), batch_size=BATCH)


class TaskWeightsData(L.LightningDataModule):
    """A user's DataModule that takes task weights (``TaskWeightSink``) but yields plain tuples."""

    def __init__(self) -> None:
        super().__init__()
        self.pushed: list[list[float]] = []

    def set_task_weights(self, weights: list[float]) -> None:
        self.pushed.append(list(weights))

    def train_dataloader(self):
        return DataLoader(Transitions(), batch_size=BATCH)


def count_transitions(batch) -> RolloutStats:
    """The plain project's counts: every row of a batch is one real env step."""
    return RolloutStats(raw_steps=len(batch[0]), valid_steps=len(batch[0]))


def test_throughput_counts_tuple_batches_through_batch_counts_fn(monkeypatch):
    ticks = itertools.count(10.0, 0.5)  # 0.5 s between consecutive batches
    monkeypatch.setattr(throughput_cb, "_now", lambda: next(ticks))
    logged: list[dict[str, float]] = []

    class Recording(PlainModule):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            logged.append({k: float(v) for k, v in self.trainer.callback_metrics.items()})

    monitor = RolloutThroughput(batch_counts_fn=count_transitions)
    quiet_trainer(max_steps=4, callbacks=[monitor]).fit(Recording())
    assert monitor.totals["raw_steps"] == monitor.totals["valid_steps"] == 4 * BATCH
    # The first batch starts the clock; from the second on: 8 steps / 0.5 s, all valid.
    assert logged[-1]["perf/raw_tps"] == logged[-1]["perf/effective_tps"] == BATCH / 0.5
    assert logged[-1]["perf/sample_efficiency"] == 1.0
    assert logged[-1]["perf/valid_steps_total"] == 4 * BATCH
    # Counters the function leaves at 0 (sampler times, episodes) give undefined ratios: not logged.
    assert "perf/time_efficiency" not in logged[-1] and "perf/mean_episode_length" not in logged[-1]


def test_throughput_without_counts_fn_warns_once_on_a_plain_run():
    monitor = RolloutThroughput()
    with pytest.warns(UserWarning, match=r"RolloutThroughput: the training batches are list") as record:
        trainer = quiet_trainer(max_steps=3, callbacks=[monitor])
        trainer.fit(PlainModule())
    assert sum("RolloutThroughput" in str(w.message) for w in record) == 1
    assert not any(k.startswith("perf/") for k in trainer.callback_metrics)


def test_dwr_on_tuple_batches_warns_once_naming_the_rollout():
    dwr = DynamicWeightedResampling(num_tasks=2)
    data = TaskWeightsData()
    match = r"DynamicWeightedResampling: .* not fastlight\.rollout\.Rollout"
    with pytest.warns(UserWarning, match=match) as w:
        quiet_trainer(max_steps=3, callbacks=[dwr]).fit(PlainModule(), datamodule=data)
    assert sum("DynamicWeightedResampling" in str(x.message) for x in w) == 1
    assert data.pushed == [[0.5, 0.5]]  # pushed at the start, never updated: no outcomes arrived


def test_env_step_budget_stops_a_plain_run_through_batch_counts_fn():
    from fastlight.callbacks.env_steps import EnvStepBudget

    budget = EnvStepBudget(total_env_steps=20, batch_counts_fn=count_transitions)
    trainer = quiet_trainer(max_steps=100, callbacks=[budget])
    trainer.fit(PlainModule())
    # 8 env steps a batch: 8, 16, 24 >= 20 stops at the 3rd batch boundary (never mid-batch).
    assert budget.env_steps == 3 * BATCH and trainer.global_step == 3


def test_env_step_budget_without_counts_fn_warns_once_on_a_plain_run():
    from fastlight.callbacks.env_steps import EnvStepBudget

    budget = EnvStepBudget(total_env_steps=5)
    match = r"EnvStepBudget: the training batches are list.*never stops"
    with pytest.warns(UserWarning, match=match) as record:
        trainer = quiet_trainer(max_steps=3, callbacks=[budget])
        trainer.fit(PlainModule())
    assert sum("EnvStepBudget" in str(w.message) for w in record) == 1
    assert budget.env_steps == 0 and trainer.global_step == 3  # the budget could not stop it, and said so
