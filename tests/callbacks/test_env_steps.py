"""EnvStepBudget: env steps counted from the Rollouts (dummy steps excluded), logged, and a budget
that stops training at the first Rollout boundary at or past it."""

from __future__ import annotations

import csv
import logging
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from fastlight.callbacks.env_steps import STATE_KEY, EnvStepBudget
from fastlight.callbacks.throughput import RolloutThroughput
from tests.callbacks.test_throughput import _TinyModule
from tests.lightning_helpers import wait_no_children

#: valid (real env) steps of BATCHES: 10, 6, 4, 4 (raw 10, 8, 8, 4: the rest are dummy steps).
CUMULATIVE = [10, 16, 20, 24]


class _Counting(_TinyModule):
    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def training_step(self, batch, batch_idx):
        self.batches += 1


def _csv_column(logger: CSVLogger, key: str) -> list[float]:
    with open(f"{logger.log_dir}/metrics.csv") as f:
        return [float(row[key]) for row in csv.DictReader(f) if row.get(key)]


def _fit(budget: EnvStepBudget, tmp_path, **trainer_kw) -> tuple[pl.Trainer, _Counting, CSVLogger]:
    logger = CSVLogger(tmp_path, name="csv")
    module = _Counting()
    trainer = pl.Trainer(max_epochs=1, callbacks=[budget], logger=logger, enable_checkpointing=False,
                         enable_model_summary=False, enable_progress_bar=False, accelerator="cpu",
                         log_every_n_steps=1, **trainer_kw)  # fmt: skip
    trainer.fit(module)
    return trainer, module, logger


def test_counts_valid_steps_and_logs_a_monotone_column(tmp_path):
    budget = EnvStepBudget()
    trainer, module, logger = _fit(budget, tmp_path)
    assert module.batches == 4 and budget.env_steps == CUMULATIVE[-1]
    assert _csv_column(logger, "env_steps") == CUMULATIVE
    assert "env_steps" in trainer.progress_bar_metrics


@pytest.mark.parametrize(("total", "batches"), [(16, 2), (17, 3), (1, 1), (10_000, 4)])
def test_budget_stops_at_the_first_rollout_boundary_at_or_past_it(tmp_path, caplog, total, batches):
    budget = EnvStepBudget(total_env_steps=total)
    with caplog.at_level(logging.INFO):
        _, module, logger = _fit(budget, tmp_path)
    assert module.batches == batches
    assert budget.env_steps == CUMULATIVE[batches - 1]
    assert _csv_column(logger, "env_steps") == CUMULATIVE[:batches]
    said = [r.getMessage() for r in caplog.records if "env-step budget reached" in r.getMessage()]
    if total <= CUMULATIVE[-1]:
        assert said == [
            f"fastlight: env-step budget reached: {CUMULATIVE[batches - 1]} env steps >= total_env_steps "
            f"{total}; stopping at this rollout boundary"
        ]
    else:
        assert said == []


def test_prog_bar_false_keeps_it_out_of_the_bar(tmp_path):
    trainer, _, logger = _fit(EnvStepBudget(prog_bar=False), tmp_path)
    assert "env_steps" not in trainer.progress_bar_metrics
    assert _csv_column(logger, "env_steps") == CUMULATIVE


def test_tensorboard_gets_metrics_against_env_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class _Logs(_Counting):
        def training_step(self, batch, batch_idx):
            super().training_step(batch, batch_idx)
            self.log("rollout/return", float(batch_idx), on_step=True, batch_size=1)

    tb = TensorBoardLogger(tmp_path, name="tb")
    trainer = pl.Trainer(max_epochs=1, callbacks=[EnvStepBudget()], logger=tb, enable_checkpointing=False,
                         enable_model_summary=False, enable_progress_bar=False, accelerator="cpu",
                         log_every_n_steps=1)  # fmt: skip
    trainer.fit(_Logs())
    tb.experiment.flush()
    events = EventAccumulator(tb.log_dir)
    events.Reload()
    scalars = events.Scalars("env_steps/rollout/return")
    assert [(s.step, s.value) for s in scalars] == [(n, float(i)) for i, n in enumerate(CUMULATIVE)]


def test_state_round_trip_and_bad_budget():
    budget = EnvStepBudget(total_env_steps=100)
    budget.env_steps = 42
    again = EnvStepBudget()
    again.load_state_dict(budget.state_dict())
    assert again.env_steps == 42 and budget.state_key == STATE_KEY
    for bad in (0, -5):
        want = rf"total_env_steps must be >= 1 or null \(no budget\), got {bad}"
        with pytest.raises(ValueError, match=want):
            EnvStepBudget(total_env_steps=bad)


class _SeesLr(_Counting):
    def __init__(self) -> None:
        super().__init__()
        self.lrs: list[float] = []

    def training_step(self, batch, batch_idx):
        super().training_step(batch, batch_idx)
        self.lrs.append(self.optimizers().optimizer.param_groups[0]["lr"])


def test_anneal_lr_falls_linearly_with_the_env_steps_trained_on(tmp_path):
    """Each update's rate is 0.1 x (1 - env steps before it / 32): CleanRL's schedule, in env steps."""
    budget = EnvStepBudget(total_env_steps=32, anneal_lr=True)
    logger = CSVLogger(tmp_path, name="csv")
    module = _SeesLr()
    trainer = pl.Trainer(max_epochs=1, callbacks=[budget], logger=logger, enable_checkpointing=False,
                         enable_model_summary=False, enable_progress_bar=False, accelerator="cpu",
                         log_every_n_steps=1)  # fmt: skip
    trainer.fit(module)
    want = [0.1 * (1 - n / 32) for n in [0, *CUMULATIVE[:-1]]]
    assert module.lrs == pytest.approx(want, rel=1e-12)
    assert _csv_column(logger, "learning_rate") == pytest.approx(want, rel=1e-6)
    # Past the budget the rate is 0, never negative.
    budget.env_steps = 40
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    budget.on_train_batch_start(SimpleNamespace(optimizers=[opt]), _Counting(), None, 0)
    assert opt.param_groups[0]["lr"] == 0.0


def test_anneal_lr_resume_keeps_the_schedule_unless_the_rate_was_changed():
    def trainer_with(*lrs: float) -> SimpleNamespace:
        groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
        return SimpleNamespace(optimizers=[torch.optim.SGD(groups)])

    first = EnvStepBudget(total_env_steps=100, anneal_lr=True)
    trainer = trainer_with(0.1, 0.01)
    first.on_train_start(trainer, None)
    first.env_steps = 50
    first.on_train_batch_start(trainer, _Counting(), None, 0)
    assert [g["lr"] for g in trainer.optimizers[0].param_groups] == pytest.approx([0.05, 0.005])
    # Restored as saved (group 0), and group 1 set anew at the resume: its new rate starts the schedule.
    resumed = EnvStepBudget(total_env_steps=100, anneal_lr=True)
    resumed.load_state_dict(first.state_dict())
    trainer = trainer_with(0.05, 0.02)
    resumed.on_train_start(trainer, None)
    resumed.on_train_batch_start(trainer, _Counting(), None, 0)
    assert [g["lr"] for g in trainer.optimizers[0].param_groups] == pytest.approx([0.05, 0.01])
    with pytest.raises(ValueError, match="anneal_lr needs total_env_steps"):
        EnvStepBudget(anneal_lr=True)


@pytest.mark.multiproc
def test_real_run_stops_within_one_rollout_past_the_budget(tmp_path):
    """Sampler processes, RLModule, CSV logger: 2 envs x 6 autoreset steps = 12 env steps a Rollout."""
    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.modules.rl_module import RLModule

    dm = RolloutDataModule(env_id="tests.fake_envs:FixedLength-v0", num_envs=2, num_workers=1,
                           reset_mode="autoreset", rollout_steps=6, steps_per_epoch=50)  # fmt: skip
    model = RLModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=1)
    budget, tput = EnvStepBudget(total_env_steps=30), RolloutThroughput()
    logger = CSVLogger(tmp_path, name="csv")
    trainer = pl.Trainer(max_steps=1000, callbacks=[budget, tput], logger=logger, enable_checkpointing=False,
                         enable_model_summary=False, enable_progress_bar=False, accelerator="cpu",
                         log_every_n_steps=1)  # fmt: skip
    trainer.fit(model, datamodule=dm)
    wait_no_children()
    assert budget.env_steps == 36 == tput.totals["valid_steps"]  # 30 <= 36 < 30 + 12
    assert model.policy_version == 3
    assert _csv_column(logger, "env_steps") == [12.0, 24.0, 36.0]


def test_cli_counts_by_default_and_takes_a_budget_by_short_name(tmp_path):
    from fastlight.cli import cli_main
    from tests.test_cli import ROOT, tiny_overrides

    base = ["--config", f"{ROOT}/configs/highway_dpsa.yaml", *tiny_overrides(),
            "--trainer.default_root_dir", str(tmp_path)]  # fmt: skip
    for extra, total in (
        ([], None),
        (["--trainer.callbacks+=EnvStepBudget", "--trainer.callbacks.total_env_steps", "50"], 50),
    ):
        cli = cli_main([*base, *extra], run=False)
        (budget,) = [c for c in cli.trainer.callbacks if isinstance(c, EnvStepBudget)]
        assert budget.total_env_steps == total
