"""The train/rollout mismatch meter: zero (to fp32 rounding) when the learner scores as the samplers
did, nonzero, logged and warned about once under bf16 autocast; on a stale batch, logged but not warned."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from fastlight.modules.logp_mismatch import WARN_ABOVE
from fastlight.modules.rl_module import RLModule
from fastlight.rollout import Rollout
from fastlight.sampling.collector import Collector
from tests.fake_envs import FixedLengthEnv


def fit(precision: str, *, stale: bool = False) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    module = RLModule(obs_dim=3, action_dim=2, hidden_sizes=(64, 64))
    module.configure_model()
    envs = [FixedLengthEnv(lengths=(3, 7, 2, 9), tag=i) for i in range(4)]
    c = Collector(envs, mode="dpsa", termination_threshold=0.5, max_horizon=8)
    rollout = c.collect(module.policy)  # sampled in fp32 by the weights the update starts from
    if stale:  # as if sampled by an earlier version (--data.max_staleness)
        rollout = Rollout(**{**rollout.__dict__, "policy_version": rollout.policy_version - 1})
    trainer = L.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", precision=precision,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=DataLoader([rollout], batch_size=None))
    return trainer.logged_metrics


def said(record: pytest.WarningsRecorder) -> list[str]:
    return [str(w.message) for w in record if "nats apart" in str(w.message)]


def test_fp32_learner_scores_as_the_samplers_did(recwarn):
    logged = fit("32-true")
    assert float(logged["rollout/logp_mismatch_max"]) < 1e-6
    assert said(recwarn) == []


def test_bf16_autocast_is_measured_and_warned_once(recwarn):
    logged = fit("bf16-mixed")
    mean, biggest = float(logged["rollout/logp_mismatch_mean"]), float(logged["rollout/logp_mismatch_max"])
    assert WARN_ABOVE < mean <= biggest < 1.0
    [line] = said(recwarn)
    assert line.startswith("fastlight: the learner scores the samplers' actions")
    assert "--trainer.precision bf16" in line


def test_a_stale_batch_is_logged_but_not_warned(recwarn):
    logged = fit("bf16-mixed", stale=True)
    assert float(logged["rollout/logp_mismatch_mean"]) > WARN_ABOVE
    assert said(recwarn) == []
