"""Demonstrations for a policy acting in chunks: H consecutive expert actions per sample, masked past
the episode's end, and the SFT token loss over the H x D tokens leaving the masked steps out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from fastlight.vla.demos import DemoDataModule, DemoDataset, Demos
from fastlight.vla.policy import VLAPolicy
from fastlight.vla.sft import VLASFTModule
from tests.lightning_helpers import quiet_trainer

A = 2  # action dimensions


def demos() -> Demos:
    """Two episodes, of 3 and 2 steps: transition i's action is [i, -i] / 10."""
    n = 5
    i = torch.arange(n, dtype=torch.float32)
    return Demos(
        obs={"proprio": torch.randn(n, 3), "instruction_ids": torch.full((n, 4), 3)},
        actions=torch.stack([i, -i], 1) / 10,
        rewards=torch.zeros(n),
        step=torch.tensor([0, 1, 2, 0, 1]),
        task_id=torch.zeros(n, dtype=torch.long),
        episode=torch.tensor([0, 0, 0, 1, 1]),
        task_names=("t",),
    )


def test_a_sample_holds_the_next_h_actions_of_its_episode_and_masks_the_rest():
    batch = DemoDataset(demos(), chunk=3)[[0, 1, 2, 3, 4]]
    assert batch["actions"].shape == (5, 3, A)
    t, f = True, False
    assert batch["valid"].tolist() == [[t, t, t], [t, t, f], [t, f, f], [t, t, f], [t, f, f]]
    # Sample 1 (episode 0, step 1): actions of transitions 1, 2, then padding (0), not episode 1's first.
    torch.testing.assert_close(batch["actions"][1], torch.tensor([[0.1, -0.1], [0.2, -0.2], [0.0, 0.0]]))
    torch.testing.assert_close(batch["actions"][3, :2], torch.tensor([[0.3, -0.3], [0.4, -0.4]]))
    plain = DemoDataset(demos())[[0, 3]]  # no chunks: today's batch
    assert plain["actions"].shape == (2, A) and "valid" not in plain


def small_policy(chunk: int, decoding: str = "parallel") -> VLAPolicy:
    torch.manual_seed(0)
    return VLAPolicy(
        vocab_size=64, n_bins=16, action_dim=A, proprio_dim=3, max_text_len=4, hidden_size=32,
        intermediate_size=32, num_attention_heads=2, num_hidden_layers=1, value_mlp_hidden=16,
        max_episode_steps=8, decoding=decoding, action_chunk=chunk,
    )  # fmt: skip


@pytest.mark.parametrize("decoding", ["parallel", "autoregressive"])
def test_sft_loss_leaves_the_padded_chunk_steps_out(decoding):
    module = VLASFTModule(policy=small_policy(3, decoding), action_dim=A)
    batch = DemoDataset(demos(), chunk=3)[[0, 1, 2, 3, 4]]
    loss, info = module.token_loss(batch)
    # By hand: the 6 tokens of each sample, step-major, the padded steps' 2 tokens each left out.
    p = module.policy
    bins = p.action_tokenizer.encode(batch["actions"].reshape(5, 3 * A))
    logits, _ = p(batch["obs"], actions=bins)
    ce = F.cross_entropy(logits.flatten(0, 1), bins.flatten(), reduction="none").view(5, 3 * A)
    mask = batch["valid"].repeat_interleave(A, dim=1)
    assert mask.sum() == 2 * 9  # 9 valid chunk steps
    torch.testing.assert_close(loss, ce[mask].mean())
    # What the padded steps hold does not matter; counting them would change the loss.
    garbage = batch["actions"].clone()
    garbage[~batch["valid"]] = 0.9
    torch.testing.assert_close(module.token_loss({**batch, "actions": garbage})[0], loss)
    everything = torch.ones(5, 3, dtype=torch.bool)
    unmasked, _ = module.token_loss({**batch, "actions": garbage, "valid": everything})
    assert abs(unmasked.item() - loss.item()) > 1e-4
    with pytest.raises(ValueError, match=r"chunks of 3 \(--model.policy.init_args.action_chunk\)"):
        module.token_loss(DemoDataset(demos())[[0, 1]])


KW = {"tasks": "reach-v3", "image": False, "max_path_length": 100}


def test_demo_chunks_follow_the_trained_policy_and_sft_runs_on_them(tmp_path):
    dm = DemoDataModule(
        env_kwargs=KW, demos_per_task=1, num_workers=0, batch_size=32, cache_dir=str(tmp_path)
    )
    assert dm.action_chunk() is None  # no trainer: no policy to follow
    module = VLASFTModule(policy=_reach_policy(4), action_dim=4, lr=3e-3, warmup_steps=2)
    dm.trainer = SimpleNamespace(lightning_module=module)
    assert dm.action_chunk() == 4
    dm.trainer = None
    seen = []
    token_loss = module.token_loss

    def spy(batch):
        seen.append((tuple(batch["actions"].shape), int((~batch["valid"]).sum())))
        return token_loss(batch)

    module.token_loss = spy
    trainer = quiet_trainer(max_steps=30, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 30 and all(shape[1:] == (4, 4) for shape, _ in seen)
    assert sum(padded for _, padded in seen) > 0  # episode ends fell inside chunks, masked
    assert float(trainer.callback_metrics["sft/loss"]) < 4.0  # from ~ln(256) = 5.5 nats per token
    assert DemoDataModule(env_kwargs=KW, cache_dir=str(tmp_path), action_chunk=2).action_chunk() == 2
    with pytest.raises(ValueError, match=r"^--data.action_chunk must be >= 1 or null"):
        DemoDataModule(env_kwargs=KW, cache_dir=str(tmp_path), action_chunk=0)


def _reach_policy(chunk: int) -> VLAPolicy:
    torch.manual_seed(0)
    return VLAPolicy(
        vocab_size=300, n_bins=256, proprio_dim=39, hidden_size=32, intermediate_size=64,
        num_attention_heads=2, value_mlp_hidden=16, max_episode_steps=100, action_chunk=chunk,
        image_size=None,  # the state-only env (KW)
    )  # fmt: skip
