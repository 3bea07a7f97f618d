"""VLASFTModule: masked token cross-entropy on demonstrations drives the loss down."""

from __future__ import annotations

import math

import pytest
import torch

from fastlight.vla.demos import DemoDataModule
from fastlight.vla.policy import VLAPolicy
from fastlight.vla.sft import VLASFTModule
from tests.lightning_helpers import quiet_trainer

KW = {"tasks": "reach-v3", "image": False, "max_path_length": 100}


def small_policy() -> VLAPolicy:
    return VLAPolicy(
        vocab_size=300,
        n_bins=256,
        proprio_dim=39,
        image_size=None,  # state only (KW): no image encoder
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        value_mlp_hidden=16,
        max_episode_steps=100,
    )


def test_token_loss_is_the_mean_over_valid_tokens_only():
    torch.manual_seed(0)
    module = VLASFTModule(policy=small_policy(), action_dim=4)
    n = 6
    batch = {
        "obs": {
            "proprio": torch.randn(n, 39),
            "instruction_ids": torch.full((n, 4), 3),
            "instruction_mask": torch.ones(n, 4, dtype=torch.long),
        },
        "actions": torch.rand(n, 4) * 2 - 1,
    }
    full, _ = module.token_loss(batch)
    valid = torch.tensor([1, 1, 1, 0, 0, 0], dtype=torch.bool)
    masked, _ = module.token_loss({**batch, "valid": valid})
    first, _ = module.token_loss(
        {**batch, "obs": {k: v[:3] for k, v in batch["obs"].items()}, "actions": batch["actions"][:3]}
    )
    # parallel decoding: a row's logits depend on that row only, so masking rows 3..5 equals dropping them
    torch.testing.assert_close(masked, first, rtol=1e-5, atol=1e-6)
    assert abs(full.item() - masked.item()) > 1e-4  # the masked rows did count in the full loss
    assert abs(full.item() - math.log(256)) < 0.5  # a fresh head is near uniform over the bins


def test_sft_on_a_few_demos_drives_the_token_loss_down(tmp_path):
    torch.manual_seed(0)
    dm = DemoDataModule(
        env_kwargs=KW, demos_per_task=2, num_workers=0, batch_size=64, cache_dir=str(tmp_path)
    )
    module = VLASFTModule(policy=small_policy(), action_dim=4, lr=3e-3, warmup_steps=10)
    trainer = quiet_trainer(max_steps=150, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    logged = trainer.callback_metrics
    assert trainer.global_step == 150
    # from ~ln(256) = 5.5 nats per token at the start
    assert float(logged["sft/loss"]) < 2.5, float(logged["sft/loss"])
    assert float(logged["sft/token_accuracy"]) > 0.25
    assert module.policy_version == 0  # SFT is not an RL update


def test_sft_refuses_rollouts_and_bad_settings():
    with pytest.raises(ValueError, match="--model.label_smoothing"):
        VLASFTModule(policy=small_policy(), label_smoothing=1.0)
    with pytest.raises(ValueError, match="--model.sil_steps"):
        VLASFTModule(policy=small_policy(), sil_steps=4)
    module = VLASFTModule(policy=small_policy(), action_dim=4)
    with pytest.raises(TypeError, match="DemoDataModule"):
        module.training_step(torch.zeros(3), 0)
