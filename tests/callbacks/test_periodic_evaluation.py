"""PeriodicEvaluation: the numbers it logs are ``fastlight evaluate``'s on the same checkpoint and seeds;
best.ckpt follows the monitored metric (max or min) and survives a resume; training's RNG streams and
train mode are left as they were; a bad setting is one line."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from fastlight.callbacks.periodic_evaluation import PeriodicEvaluation
from fastlight.callbacks.preemption import PreemptionCheckpoint
from fastlight.modules.rl_module import RLModule
from tests.faults.test_preemption import STEPS_PER_UPDATE, Rollouts, SignalInUpdate, saved_step, trainer

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.multiproc
def test_logged_numbers_are_fastlight_evaluates_on_the_same_checkpoint(tmp_path, capsys):
    from fastlight.cli import cli_main
    from fastlight.evaluate import main as evaluate

    root = tmp_path / "run"
    cli_main([
        "fit", "--config", str(ROOT / "configs" / "highway_dpsa.yaml"),
        "--config", str(ROOT / "callbacks" / "evaluation.yaml"),
        "--trainer.callbacks.every_updates", "1", "--trainer.callbacks.episodes", "3",
        "--data.num_workers", "1", "--data.num_envs", "4", "--data.steps_per_epoch", "10",
        "--model.update_epochs", "1", "--model.num_minibatches", "2", "--trainer.max_steps", "6",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root),
    ])  # fmt: skip
    rows = [
        r for r in csv.DictReader(open(root / "csv" / "version_0" / "metrics.csv")) if r.get("eval/return")
    ]
    assert len(rows) == 3  # one evaluation after each of the 3 updates (2 optimizer steps each)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("fastlight: eval at step")]
    assert len(lines) == 3
    run = root / "checkpoints" / "version_0"
    i = max(range(3), key=lambda k: float(rows[k]["eval/return"]))  # the first of the best is kept
    best = rows[i]
    for ckpt, row in ((run / "best.ckpt", best), (run / "last.ckpt", rows[-1])):
        got = evaluate(["--ckpt", str(ckpt), "--episodes", "3", "--out", str(tmp_path / "e.json")])["summary"]
        torch.testing.assert_close(got["return"]["mean"], float(row["eval/return"]), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(
            got["return"]["ci_low"], float(row["eval/return_ci_low"]), rtol=1e-6, atol=1e-6
        )
        assert got["length"]["mean"] == pytest.approx(float(row["eval/length"]))
        assert got["crash_rate"]["rate"] == pytest.approx(float(row["eval/crash_rate"]))
    assert saved_step(run / "best.ckpt") == 2 * (i + 1)


def scripted(monkeypatch, key: str, values: list[float]) -> list[float]:
    """The evaluations return ``values`` in turn for ``key`` (the selection logic, without episodes)."""
    left = list(values)

    def play(self, trainer, module):
        v = left.pop(0)
        return {
            "eval/return": v,
            "eval/return_ci_low": v,
            "eval/return_ci_high": v,
            "eval/length": 1.0,
            key: v,
        }

    monkeypatch.setattr(PeriodicEvaluation, "_play", play)
    return left


@pytest.mark.parametrize(
    "monitor, mode, values, best_eval",
    [
        ("eval/return", "max", [1.0, 3.0, 2.0, 3.0], 2),  # a tie keeps the first
        ("eval/crash_rate", "min", [0.5, 0.2, 0.4, 0.3], 2),
    ],
)
def test_best_ckpt_follows_the_monitor(tmp_path, monkeypatch, monitor, mode, values, best_eval):
    scripted(monkeypatch, monitor, values)
    cb = PeriodicEvaluation(every_updates=1, monitor=monitor, mode=mode, env_id="unused")
    keeper = PreemptionCheckpoint(every_minutes=None, version=0)
    t = trainer(tmp_path, keeper, max_steps=len(values) * STEPS_PER_UPDATE)
    t.callbacks.append(cb)
    t.fit(SignalInUpdate(), DataLoader(Rollouts(50), batch_size=None))
    best = tmp_path / "checkpoints" / "version_0" / "best.ckpt"
    assert cb.best_path(t) == str(best) and cb.evaluations == len(values)
    assert cb.best == values[best_eval - 1] and saved_step(best) == best_eval * STEPS_PER_UPDATE
    # Resumed with its state, a worse score does not replace the file.
    again = PeriodicEvaluation(every_updates=1, monitor=monitor, mode=mode, env_id="unused")
    again.load_state_dict(cb.state_dict())
    scripted(monkeypatch, monitor, [values[0]])
    t = trainer(tmp_path / "resumed", PreemptionCheckpoint(every_minutes=None), max_steps=STEPS_PER_UPDATE)
    t.callbacks.append(again)
    t.fit(SignalInUpdate(), DataLoader(Rollouts(50), batch_size=None))
    assert again.best == values[best_eval - 1] and not os.path.exists(again.best_path(t))


def test_an_evaluation_is_logged_at_its_update_only(tmp_path, monkeypatch):
    """Lightning logs a value a callback logged through ``LightningModule.log`` again at every later step of
    the epoch; an evaluation every 2nd update must read as one row per evaluation, not one per update."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    scripted(monkeypatch, "eval/return", [1.0, 2.0])
    cb = PeriodicEvaluation(every_updates=2, env_id="unused", save_best=False)
    quiet = {"enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
    t = L.Trainer(logger=CSVLogger(tmp_path), callbacks=[cb], max_steps=4 * STEPS_PER_UPDATE,
                  log_every_n_steps=1, **quiet)  # fmt: skip
    t.fit(SignalInUpdate(), DataLoader(Rollouts(50), batch_size=None))
    rows = list(csv.DictReader(open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv")))
    logged = [(int(r["step"]), float(r["eval/return"])) for r in rows if r.get("eval/return")]
    assert [v for _, v in logged] == [1.0, 2.0], logged
    assert logged[1][0] > logged[0][0]  # at the 2nd and 4th updates' steps
    assert float(t.callback_metrics["eval/return"]) == 2.0  # a monitor still reads the latest


def test_evaluation_leaves_the_training_rng_and_mode_as_they_were():
    module = RLModule(obs_dim=3, action_dim=2)
    module.configure_model()
    module.policy.train()
    cb = PeriodicEvaluation(episodes=3, deterministic=False, env_id="tests.fake_envs:FixedLength-v0",
                            env_kwargs={"lengths": [4, 6]})  # fmt: skip
    state = torch.get_rng_state()
    first = cb._play(SimpleNamespace(datamodule=None), module)
    assert torch.equal(torch.get_rng_state(), state) and module.policy.training
    assert first["eval/length"] == pytest.approx((4 + 6 + 4) / 3)  # seeds 10000.. pick the lengths
    assert cb._play(SimpleNamespace(datamodule=None), module) == first  # sampled, yet on fixed seeds


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"every_updates": 0}, "PeriodicEvaluation every_updates must be >= 1 or null, got 0"),
        ({"every_updates": None}, "PeriodicEvaluation needs every_updates or every_minutes"),
        ({"every_minutes": -1.0}, "PeriodicEvaluation every_minutes must be > 0 or null, got -1.0"),
        (
            {"monitor": "eval/reward"},
            "PeriodicEvaluation monitor must be one of eval/return, .* got 'eval/reward'",
        ),
        ({"mode": "best"}, "PeriodicEvaluation mode must be max or min, got 'best'"),
        ({"episodes": 0}, "PeriodicEvaluation episodes and batch must be >= 1, got 0 and 4"),
    ],
)
def test_bad_settings_are_one_line(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PeriodicEvaluation(**kwargs)


def test_fsdp2_is_refused_in_one_line_instead_of_hanging():
    from lightning.pytorch.strategies import ModelParallelStrategy

    with pytest.raises(ValueError, match="PeriodicEvaluation does not run under --trainer.strategy fsdp2"):
        PeriodicEvaluation().setup(SimpleNamespace(strategy=ModelParallelStrategy()), None, "fit")
