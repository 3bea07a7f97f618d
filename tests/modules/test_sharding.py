"""``fastlight.modules.sharding``: the ``fsdp2`` strategy name, which modules become FSDP2 units, the
forward methods, and the FSDP1 refusal. One process (a world of 1 on gloo) shards for real here; two
ranks train in ``tests/modules/test_fsdp2.py``."""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy

import fastlight.modules.policy_module  # noqa: F401  (registers fsdp2, as any fastlight module does)
from fastlight.models.mlp import MLPActorCritic
from fastlight.modules.sharding import block_classes, refuse_fsdp1, shard_policy
from fastlight.weights.sharded import full, local
from tests.vla.test_vla_policy import _obs, _policy


def test_fsdp2_is_lightnings_model_parallel_strategy_saving_one_file():
    trainer = pl.Trainer(strategy="fsdp2", accelerator="cpu", devices=1, logger=False)
    assert type(trainer.strategy) is ModelParallelStrategy
    assert trainer.strategy._save_distributed_checkpoint is False


def test_fsdp1_is_refused_in_one_line_naming_fsdp2():
    with pytest.raises(ValueError, match=r"^--trainer.strategy fsdp \(FSDP1\).*use --trainer.strategy fsdp2"):
        refuse_fsdp1(FSDPStrategy())
    refuse_fsdp1(DDPStrategy())
    refuse_fsdp1(ModelParallelStrategy())


def test_blocks_are_the_hugging_face_no_split_modules():
    policy = _policy(num_hidden_layers=2)
    (cls,) = block_classes(policy)
    assert cls.__name__ in policy.backbone._no_split_modules
    assert sum(type(m) is cls for m in policy.modules()) == 2
    assert block_classes(MLPActorCritic(obs_dim=3, action_dim=2)) == set()


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield torch.distributed.device_mesh.init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("decoding", ["parallel", "autoregressive"])
def test_a_sharded_policy_computes_what_the_whole_one_does(world_of_one, decoding):
    whole = _policy(num_hidden_layers=2, decoding=decoding)
    sharded = copy.deepcopy(whole)
    assert shard_policy(sharded, world_of_one) == ["backbone.model.layers.0", "backbone.model.layers.1"]
    assert shard_policy(sharded, world_of_one) == []  # idempotent
    obs, step = _obs(), torch.tensor([0, 3, 7])
    # evaluate, value and act are FSDP forward methods: each gathers the parameters it reads (an
    # unregistered one would meet sharded DTensor parameters and fail).
    torch.manual_seed(5)
    a = whole.act(obs, step=step)
    torch.manual_seed(5)
    b = sharded.act(obs, step=step)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-6)
    e_whole = whole.evaluate(obs, a.actions, step=step)
    e_sharded = sharded.evaluate(obs, a.actions, step=step)
    for x, y in zip(e_whole, e_sharded, strict=True):
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-6)
    values = sharded.value(obs, step=step)
    torch.testing.assert_close(values, whole.value(obs, step=step), rtol=1e-6, atol=1e-6)
    # Gradients reach every parameter, as whole tensors once gathered.
    (e_whole.logprobs.sum() + e_whole.values.sum()).backward()
    (e_sharded.logprobs.sum() + e_sharded.values.sum()).backward()
    grads = dict(whole.named_parameters())
    for name, p in sharded.named_parameters():
        if grads[name].grad is None:
            assert p.grad is None, name
            continue
        torch.testing.assert_close(full(p.grad), grads[name].grad, rtol=1e-5, atol=1e-6, msg=name)
        assert local(p.grad).shape == p.grad.shape  # one rank holds the whole shard
    plain = torch.ones(3)
    assert full(plain) is plain and local(plain) is plain
