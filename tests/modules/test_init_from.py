"""--model.init_from: exact weight round trip, value head optional, mismatches named."""

from __future__ import annotations

import pytest
import torch

from fastlight.models.mlp import MLPActorCritic
from fastlight.modules.init_from import load_policy_weights
from fastlight.vla.policy import VLAPolicy


def vla(**kw) -> VLAPolicy:
    base = dict(
        vocab_size=300,
        proprio_dim=39,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        value_mlp_hidden=16,
        max_episode_steps=100,
    )
    return VLAPolicy(**{**base, **kw})


def save(tmp_path, policy, *, drop_prefix: str | None = None):
    sd = {f"policy.{k}": v.clone() for k, v in policy.state_dict().items()}
    if drop_prefix:
        sd = {k: v for k, v in sd.items() if not k.startswith(f"policy.{drop_prefix}")}
    path = tmp_path / "src.ckpt"
    torch.save({"state_dict": {**sd, "_policy_version": torch.tensor(7)}}, path)
    return path


def test_round_trip_is_exact_and_value_head_is_loaded(tmp_path):
    torch.manual_seed(0)
    src = vla()
    torch.manual_seed(1)
    dst = vla()
    info = load_policy_weights(dst, save(tmp_path, src))
    assert info["value_loaded"] and info["tensors"] == len(src.state_dict())
    for (k, a), b in zip(src.state_dict().items(), dst.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)


def test_a_policy_without_separate_value_parameters_reports_its_value_head_loaded(tmp_path):
    """An MLP keeps no value parameters apart: every tensor is required, so the value head loaded."""
    torch.manual_seed(0)
    src = MLPActorCritic(3, 2, hidden_sizes=(8,))
    torch.manual_seed(1)
    dst = MLPActorCritic(3, 2, hidden_sizes=(8,))
    info = load_policy_weights(dst, save(tmp_path, src))
    assert info["value_loaded"] and info["tensors"] == len(src.state_dict())
    torch.testing.assert_close(dst.state_dict(), src.state_dict(), rtol=0, atol=0)


def test_checkpoint_without_value_head_leaves_it_at_init(tmp_path):
    torch.manual_seed(0)
    src = vla()
    torch.manual_seed(1)
    dst = vla()
    before = {k: v.clone() for k, v in dst.value_head.state_dict().items()}
    info = load_policy_weights(dst, save(tmp_path, src, drop_prefix="value_head."))
    assert not info["value_loaded"]
    for k, v in dst.value_head.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    torch.testing.assert_close(dst.action_queries, src.action_queries, rtol=0, atol=0)


def test_mismatched_shapes_name_the_tensor_and_both_shapes(tmp_path):
    path = save(tmp_path, vla(hidden_size=32))
    dst = vla(hidden_size=64)
    before = dst.action_queries.detach().clone()
    with pytest.raises(
        ValueError,
        match=r"--model.init_from: .*src.ckpt.*action_queries: checkpoint \[4, 32\] "
        r"vs this model \[4, 64\]",
    ):
        load_policy_weights(dst, path)
    torch.testing.assert_close(dst.action_queries, before, rtol=0, atol=0)  # nothing copied
    with pytest.raises(ValueError, match=r"lm_head.weight: checkpoint \[256, 32\] vs this model \[128, 32\]"):
        load_policy_weights(vla(n_bins=128), path)


def test_missing_file_other_policy_and_non_checkpoint_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--model.init_from: no checkpoint file at .*nope.ckpt"):
        load_policy_weights(vla(), tmp_path / "nope.ckpt")
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"--model.init_from: .*junk.ckpt is not a readable checkpoint"):
        load_policy_weights(vla(), junk)
    mlp_path = save(tmp_path, MLPActorCritic(4, 2))
    with pytest.raises(ValueError, match="missing from the checkpoint.*not in this model"):
        load_policy_weights(vla(), mlp_path)
