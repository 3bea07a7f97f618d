"""RolloutProgressBar: what the bar reads on a real Trainer fit of RLModule over Rollout batches."""

from __future__ import annotations

import io
import os
import sys

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ProgressBar, TQDMProgressBar
from torch.utils.data import DataLoader

import fastlight.callbacks.progress as progress
from fastlight.callbacks.env_steps import EnvStepBudget
from fastlight.callbacks.progress import RolloutProgressBar
from fastlight.modules.rl_module import RLModule
from fastlight.rollout import EpisodeRecord, Rollout, RolloutStats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rollout(valid_steps: int, returns: list[float], lengths: list[int]) -> Rollout:
    """A [4, 1] Rollout of a 2-d observation, 2-action env; its stats say ``valid_steps`` env steps
    (the counters the callbacks read; the tensors stay small)."""
    t = 4
    done = torch.zeros(t, 1, dtype=torch.bool)
    done[-1] = True
    z, lz = torch.zeros(t, 1), torch.zeros(t, 1, dtype=torch.long)
    eps = [
        EpisodeRecord(length=n, ret=r, terminated=True, truncated=False)
        for r, n in zip(returns, lengths, strict=True)
    ]
    stats = RolloutStats(raw_steps=valid_steps, valid_steps=valid_steps, episodes=eps)
    valid = torch.ones(t, 1, dtype=torch.bool)
    return Rollout(obs=torch.randn(t, 1, 2), actions=lz, logprobs=z - 0.7, values=z, rewards=z + 1.0,
                   terminated=done, truncated=torch.zeros_like(done), valid=valid, step=lz, task_id=lz,
                   policy_version=lz, bootstrap_values=z, stats=stats).validate()  # fmt: skip


#: 4,000 + 6,202 = 10,202 env steps after two Rollouts, 13,202 after three.
ROLLOUTS = [
    _rollout(4000, [10.0], [30]),
    _rollout(6202, [12.0, 14.0], [35, 37]),
    _rollout(3000, [20.0, 26.8], [41, 42]),  # return 23.4, ep_len 41.5
    _rollout(5000, [1.0], [5]),
    _rollout(5000, [1.0], [5]),
]


class _Terminal(io.StringIO):
    """A stdout that says it is a terminal and keeps what the bar drew."""

    def isatty(self) -> bool:
        return True


class _Clock(Callback):
    """The bar's clock: 4 s per Rollout, ticked before each one."""

    def __init__(self) -> None:
        self.t = 0.0

    def on_train_batch_start(self, *_: object) -> None:
        self.t += 4.0


class _StopAfter(Callback):
    def __init__(self, n: int) -> None:
        self.n = n

    def on_train_batch_end(self, trainer: pl.Trainer, *_: object) -> None:
        if trainer.fit_loop.epoch_loop.batch_progress.total.processed >= self.n:
            trainer.should_stop = True


def _fit(monkeypatch: pytest.MonkeyPatch, *, stdout: io.StringIO | None = None, callbacks=(), **trainer_kw):
    """Fit RLModule (2 x 2 = 4 optimizer steps per Rollout) on ROLLOUTS; returns (bar, what it drew).
    The bar is listed last, as Lightning places its own: it shows what the others logged."""
    clock = _Clock()
    monkeypatch.setattr(progress, "_now", lambda: clock.t)
    out = _Terminal() if stdout is None else stdout
    monkeypatch.setattr(sys, "stdout", out)
    bar = RolloutProgressBar()
    trainer = pl.Trainer(callbacks=[clock, *callbacks, bar], logger=False, enable_checkpointing=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, **trainer_kw)  # fmt: skip
    module = RLModule(obs_dim=2, action_dim=2, update_epochs=2, num_minibatches=2)
    trainer.fit(module, train_dataloaders=DataLoader(ROLLOUTS, batch_size=None, collate_fn=lambda r: r))
    return bar, out.getvalue()


def _never_mixed(text: str) -> None:
    assert "13202.0" not in text and "10202.0" not in text  # env steps are counts, never padded floats
    assert "/-" not in text and "-2" not in text and "Epoch" not in text


def test_max_steps_gives_a_rollout_total_in_rl_units(monkeypatch: pytest.MonkeyPatch) -> None:
    # 12 optimizer steps / 4 per Rollout = 3 Rollouts (Lightning's bar would say 12).
    bar, drawn = _fit(monkeypatch, callbacks=[EnvStepBudget()], max_steps=12)
    # SPS: the 9,202 env steps after the first Rollout over the 8 s since it (cleanrl's SPS).
    final = "rollout 3/3 | env_steps 13,202 | return 23.4 | ep_len 41.5 | SPS 1,150"
    assert bar.train_progress_bar.desc == final
    assert (bar.train_progress_bar.n, bar.train_progress_bar.total) == (3, 3)
    assert "rollout 1/3 | env_steps 4,000 | return 10 | ep_len 30 |" in drawn
    assert "rollout 2/3 | env_steps 10,202 | return 13 | ep_len 36 | SPS 1,550 |" in drawn
    assert " 33% [" in drawn and "100% [" in drawn
    _never_mixed(drawn)


def test_env_step_budget_gives_an_env_step_total(monkeypatch: pytest.MonkeyPatch) -> None:
    bar, drawn = _fit(monkeypatch, callbacks=[EnvStepBudget(total_env_steps=12_000)], max_epochs=-1)
    # No rollout total (no max_steps, no max_epochs); the bar fills in env steps, capped at the budget.
    assert bar.train_progress_bar.desc.startswith("rollout 3 | env_steps 13,202/12,000 | return 23.4 |")
    assert (bar.train_progress_bar.n, bar.train_progress_bar.total) == (12_000, 12_000)
    assert "rollout 1 | env_steps 4,000/12,000 |" in drawn and " 33% [" in drawn  # 4,000 of 12,000
    assert "rollout 1/" not in drawn and "100% [" in drawn
    _never_mixed(drawn)


def test_no_total_without_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    bar, drawn = _fit(monkeypatch, callbacks=[EnvStepBudget(), _StopAfter(2)], max_epochs=-1)
    assert bar.train_progress_bar.desc.startswith("rollout 2 | env_steps 10,202 | return 13 |")
    assert bar.train_progress_bar.total is None
    lines = [line for line in drawn.replace("\r", "\n").split("\n") if line.strip()]
    assert lines and all("%" not in line and "|#" not in line for line in lines)  # no bar, no percentage
    assert lines[-1].startswith("rollout 2 | env_steps 10,202 | return 13 | ep_len 36 | SPS 1,550 [")
    _never_mixed(drawn)


def test_max_epochs_bounds_the_rollouts(monkeypatch: pytest.MonkeyPatch) -> None:
    bar, drawn = _fit(monkeypatch, max_epochs=1, limit_train_batches=2)
    # No EnvStepBudget: no env_steps item, and no SPS (nothing to count it from).
    assert bar.train_progress_bar.desc == "rollout 2/2 | return 13 | ep_len 36"
    _never_mixed(drawn)


def test_effective_tps_is_the_sps_when_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    class _Tps(Callback):
        def on_train_batch_end(self, trainer, pl_module, *_: object) -> None:
            pl_module.log("perf/effective_tps", 1949.6, prog_bar=True, batch_size=1)
            pl_module.log("my/loss", 0.012345, prog_bar=True, batch_size=1)

    bar, _ = _fit(monkeypatch, callbacks=[EnvStepBudget(), _Tps()], max_steps=8)
    assert bar.train_progress_bar.desc == (
        "rollout 2/2 | env_steps 10,202 | return 13 | ep_len 36 | SPS 1,950 | my/loss 0.0123"
    )


def test_off_when_stdout_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A log file gets no redraws, but a plain line every log_every_s seconds and one at the end."""
    bar, drawn = _fit(monkeypatch, stdout=io.StringIO(), callbacks=[EnvStepBudget()], max_steps=12)
    assert not bar.is_enabled and bar.train_progress_bar.disable
    assert "\r" not in drawn and "|#" not in drawn  # no bar
    # The clock ticks 4 s per Rollout: the first line after Rollout 1, then none within 60 s, the last.
    assert drawn.splitlines() == [
        "fastlight: rollout 1/3 | env_steps 4,000 | return 10 | ep_len 30 | 33% | "
        "0:00:04 elapsed, 0:00:08 left",
        "fastlight: rollout 3/3 | env_steps 13,202 | return 23.4 | ep_len 41.5 | SPS 1,150 | 100% | "
        "0:00:12 elapsed, 0:00:00 left",
    ]


def test_max_time_bounds_the_time_left_in_a_log_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """With max_time nearer than max_steps, the line counts down the Timer's clock, not the steps'."""
    from lightning.pytorch.callbacks import Timer

    class _Timer(Timer):  # Lightning's Timer on the test's clock: 100 s allowed, 30 s spent per Rollout
        def __init__(self) -> None:
            super().__init__(duration={"seconds": 100})
            self.n = 0

        def on_train_batch_start(self, *_: object) -> None:
            self.n += 1

        def time_elapsed(self, stage: str = "train") -> float:
            return 30.0 * self.n

    bar, drawn = _fit(monkeypatch, stdout=io.StringIO(), callbacks=[EnvStepBudget(), _Timer()], max_steps=400)
    first = drawn.splitlines()[0]
    # By steps: rollout 1 of 100, 0:06:36 left; by the Timer: 30 of 100 s spent, 70 s left.
    assert first.endswith("| 30% | 0:00:04 elapsed, 0:01:10 left"), first


def _cli(tmp_path, *extra: str):
    from fastlight.cli import cli_main

    args = ["--config", os.path.join(ROOT, "configs", "highway_dpsa.yaml"), "--trainer.max_steps", "1",
            "--data.num_workers", "1", "--data.num_envs", "2", "--data.max_horizon", "5",
            "--trainer.default_root_dir", str(tmp_path), *extra]  # fmt: skip
    trainer = cli_main(args, run=False).trainer
    return [c for c in trainer.callbacks if isinstance(c, ProgressBar)], trainer


def test_cli_adds_the_bar_unless_the_user_has_one_or_turns_it_off(tmp_path) -> None:
    bars, trainer = _cli(tmp_path)
    assert [type(b) for b in bars] == [RolloutProgressBar] and trainer.progress_bar_callback is bars[0]
    bars, trainer = _cli(tmp_path, "--trainer.enable_progress_bar", "false")
    assert bars == [] and trainer.progress_bar_callback is None
    bars, _ = _cli(tmp_path, "--trainer.callbacks+=TQDMProgressBar")
    assert [type(b) for b in bars] == [TQDMProgressBar]  # the user's own, alone
    bars, _ = _cli(tmp_path, "--trainer.callbacks+=RolloutProgressBar", "--trainer.callbacks.refresh_rate=5")
    assert [type(b) for b in bars] == [RolloutProgressBar] and bars[0].refresh_rate == 5  # the short name
