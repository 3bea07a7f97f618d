"""Checkpoints resume a run: policy version, optimizer, callback state (DWR, throughput totals)."""

from __future__ import annotations

import os

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fastlight.callbacks.dwr import DynamicWeightedResampling
from fastlight.callbacks.throughput import RolloutThroughput
from fastlight.data.datamodule import RolloutDataModule
from fastlight.modules.rl_module import RLModule
from tests.lightning_helpers import wait_no_children


def fit(tmp_path, max_steps: int, ckpt_path: str | None = None):
    import lightning as L

    dm = RolloutDataModule(
        env_id="tests.fake_envs:TwoTask-v0",
        num_envs=2,
        num_workers=1,
        reset_mode="autoreset",
        rollout_steps=6,
        steps_per_epoch=2,
    )
    model = RLModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=1)
    dwr, tput = DynamicWeightedResampling(num_tasks=2, window=50), RolloutThroughput()
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True), dwr, tput],
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model, dwr, tput


@pytest.mark.multiproc
def test_resume_continues_versions_and_callback_state(tmp_path):
    model, dwr, tput = fit(tmp_path, max_steps=2)
    assert model.policy_version == 2
    outcomes = [list(w) for w in dwr.outcomes]
    assert sum(map(len, outcomes)) > 0
    weights = {k: v.clone() for k, v in model.policy.state_dict().items()}
    ckpt = os.path.join(tmp_path, "last.ckpt")
    ckpt_state = torch.load(ckpt, weights_only=False)["state_dict"]
    for k, v in weights.items():  # the checkpoint holds the final weights of the first fit
        assert torch.equal(ckpt_state[f"policy.{k}"], v)

    resumed, dwr2, tput2 = fit(tmp_path, max_steps=4, ckpt_path=ckpt)
    assert resumed.policy_version == 4  # counting went on from the checkpoint
    # DWR windows were restored, then extended by the two new updates' outcomes.
    for old, new in zip(outcomes, dwr2.outcomes, strict=True):
        assert list(new)[: len(old)] == old
    assert sum(map(len, dwr2.outcomes)) > sum(map(len, outcomes))
    assert tput2.totals["valid_steps"] > tput.totals["valid_steps"]
    wait_no_children()
