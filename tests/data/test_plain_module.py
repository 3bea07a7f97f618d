"""RolloutDataModule feeding a plain LightningModule (not an RLModule): the small typed surface
(``RolloutPolicyModule``), no hparams clash, and a stalled ``policy_version`` named, not waited on."""

from __future__ import annotations

import time

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.loggers import CSVLogger

from fastlight.data.datamodule import RolloutDataModule
from fastlight.fleet.faults import FaultSettings
from fastlight.losses import masked_mean
from fastlight.models.mlp import MLPActorCritic
from fastlight.rollout import Rollout
from tests.lightning_helpers import quiet_trainer, wait_no_children

pytestmark = pytest.mark.multiproc
FIXED = "tests.fake_envs:FixedLength-v0"


class PlainModule(L.LightningModule):
    """A user's own module: automatic optimisation, its own ``steps_per_epoch`` and ``seed`` hparams."""

    def __init__(self, steps_per_epoch: int = 512, seed: int = 3, bump: bool = True) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.policy = MLPActorCritic(3, 2, hidden_sizes=(8,))
        self.policy_version = 0
        self.versions: list[int] = []

    def training_step(self, batch: Rollout, batch_idx: int) -> torch.Tensor:
        self.versions.append(int(batch.policy_version[batch.valid].max()))
        out = self.policy.evaluate(batch.obs.flatten(0, 1), batch.actions.flatten(0, 1))
        loss = masked_mean(-out.logprobs, batch.valid.flatten())
        self.log("loss", loss, batch_size=1)
        if self.hparams.bump:
            self.policy_version += 1  # published before the next batch, after this optimizer step
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.policy.parameters(), lr=0.01)


def data(**kw) -> RolloutDataModule:
    return RolloutDataModule(
        env_id=FIXED, env_kwargs={"lengths": (3, 2)}, num_envs=2, num_workers=1, steps_per_epoch=4, **kw
    )


def test_plain_module_trains_on_policy_and_its_hparams_do_not_clash(tmp_path):
    model = PlainModule()
    logger = CSVLogger(tmp_path)  # with a logger, Lightning merges the module's and the data's hparams
    trainer = L.Trainer(
        max_steps=3, logger=logger, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu"
    )
    trainer.fit(model, datamodule=data(seed=5))
    assert model.versions == [0, 1, 2]  # every step on the weights of the previous update
    saved = yaml.safe_load(open(f"{logger.log_dir}/hparams.yaml"))
    # Both steps_per_epoch (and seed) kept, the DataModule's under data.*: no "Error while merging".
    assert saved["steps_per_epoch"] == 512 and saved["data.steps_per_epoch"] == 4
    assert saved["seed"] == 3 and saved["data.seed"] == 5
    wait_no_children()


def test_module_without_policy_is_refused_naming_the_protocol():
    class NoPolicy(PlainModule):
        def __init__(self) -> None:
            super().__init__()
            self.agent = self.policy  # the network under another name (Lightning's PPO template)
            del self.policy

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.agent.parameters(), lr=0.01)

    with pytest.raises(
        TypeError,
        match=r"implementing fastlight\.data\.protocols\.RolloutPolicyModule; "
        r"the run has NoPolicy, which lacks policy$",
    ):
        quiet_trainer(max_steps=1).fit(NoPolicy(), datamodule=data())
    wait_no_children()


def test_stalled_policy_version_is_named_at_once_not_after_the_worker_timeout():
    t0 = time.monotonic()
    dm = data(faults=FaultSettings(worker_timeout_s=120))
    with pytest.raises(RuntimeError, match="PlainModule.policy_version has not advanced since 0") as err:
        quiet_trainer(max_steps=5).fit(PlainModule(bump=False), datamodule=dm)
    assert "must add 1 to policy_version after each update" in str(err.value)
    assert time.monotonic() - t0 < 60  # named after the first step, not after the worker timeout
    wait_no_children()


@pytest.mark.slow
def test_stalled_version_with_staleness_allowed_warns_once():
    model = PlainModule(bump=False)
    with pytest.warns(UserWarning, match="samplers keep acting with these weights") as record:
        quiet_trainer(max_steps=4).fit(model, datamodule=data(max_staleness=1))
    assert len([w for w in record if "has not advanced" in str(w.message)]) == 1
    assert model.versions == [0, 0, 0, 0]
    wait_no_children()
