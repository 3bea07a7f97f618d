"""WeightSync and DWR stop a run whose DataModule cannot serve them, and WeightSync logs SyncStats."""

from __future__ import annotations

import gymnasium as gym
import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from fastlight.callbacks.dwr import DynamicWeightedResampling
from fastlight.callbacks.weight_sync import WeightSync
from fastlight.data.datamodule import RolloutDataModule
from fastlight.modules.rl_module import RLModule
from fastlight.sampling.task_weights import SharedTaskWeights
from tests.lightning_helpers import quiet_trainer, wait_no_children

FIXED = "tests.fake_envs:FixedLength-v0"


class PlainData(L.LightningDataModule):
    """A user's own DataModule: tensors, no samplers, no weights to publish, no task weights."""

    def train_dataloader(self):
        return DataLoader(torch.zeros(4, 3), batch_size=2)


class Plain(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize(
    ("callback", "match"),
    [
        (
            WeightSync(),
            r"WeightSync needs a DataModule implementing fastlight\.data\.protocols\.WeightPublishing; "
            r"the run has PlainData, which lacks last_sync, request_drain",
        ),
        (
            DynamicWeightedResampling(num_tasks=2),
            r"DynamicWeightedResampling needs a DataModule implementing .*TaskWeightSink; the run has "
            r"PlainData, which lacks set_task_weights",
        ),
    ],
)
def test_callbacks_refuse_a_datamodule_that_cannot_serve_them(callback, match):
    with pytest.raises(TypeError, match=match):
        quiet_trainer(max_steps=1, callbacks=[callback]).fit(Plain(), datamodule=PlainData())


def test_dwr_without_any_datamodule_says_so():
    with pytest.raises(TypeError, match=r"the run has no DataModule \(trainer\.datamodule is None\)"):
        loader = DataLoader(torch.zeros(4, 3), batch_size=2)
        quiet_trainer(max_steps=1, callbacks=[DynamicWeightedResampling(num_tasks=2)]).fit(Plain(), loader)


def test_weight_sync_needs_a_policy_module():
    dm = RolloutDataModule(env_id=FIXED, num_envs=1, num_workers=1)
    match = r"WeightSync needs a LightningModule .*TrainsPolicy; the run has Plain,"
    with pytest.raises(TypeError, match=match):
        quiet_trainer(max_steps=1, callbacks=[WeightSync()]).fit(Plain(), datamodule=dm)
    wait_no_children()


@pytest.mark.multiproc
def test_weight_sync_logs_each_publish_once_with_its_stats():
    logged: list[dict[str, float]] = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            logged.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("sync/")})

    dm = RolloutDataModule(env_id=FIXED, num_envs=2, num_workers=1)
    model = RLModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=1)
    quiet_trainer(max_steps=3, callbacks=[WeightSync(), Record()]).fit(model, datamodule=dm)
    wait_no_children()
    # Shared-memory path: the publish before batch k carries version k; every sync/* key is logged.
    assert [m["sync/version"] for m in logged] == [0.0, 1.0, 2.0]
    keys = {"sync/latency_ms", "sync/trainer_wait_ms", "sync/bytes", "sync/collectives", "sync/version"}
    assert set(logged[0]) == keys | {"sync/verified"}
    # --data.faults.verify_weights_every 1 (the default): every version checked on the one sampler.
    assert [m["sync/verified"] for m in logged] == [1.0, 2.0, 3.0]
    floats = sum(p.numel() for p in model.policy.state_dict().values() if p.is_floating_point())
    assert logged[-1]["sync/bytes"] == 4 * floats  # the whole float32 buffer
    assert dm.last_sync.version == 2 and dm.last_sync.mode == "shared_memory"


def test_task_weights_refuse_an_env_that_cannot_take_them():
    weights = SharedTaskWeights(torch.multiprocessing.get_context("spawn"))
    env = gym.make("CartPole-v1")
    assert weights.apply([env], seen=0) == 0  # nothing set yet: nothing to apply
    weights.set([1.0, 2.0])
    with pytest.raises(TypeError, match=r"env CartPoleEnv has no set_task_weights"):
        weights.apply([env], seen=0)
