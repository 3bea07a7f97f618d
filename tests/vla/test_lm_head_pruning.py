"""lm_head pruning (AcceRL §lm_head pruning): exact logits, size, tied embeddings, save/load."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fastlight.vla.hf_vlm import build_llama
from fastlight.vla.pruning import load_pruned_causal_lm, prune_lm_head, pruned_range

V, D, N_ACT = 1024, 32, 64


def _llama(tied: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return build_llama(V, D, 1, 4, 64, tie_word_embeddings=tied).eval()


def test_pruned_logits_equal_original_at_action_ids() -> None:
    model = _llama()
    ids = torch.randint(0, V, (3, 9))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        prune_lm_head(model, V - N_ACT, V)
        pruned = model(input_ids=ids).logits
    assert pruned.shape == (3, 9, N_ACT)
    # An [N_ACT, D] GEMM against a sliced [V, D] one: equal up to rounding. 1e-5 (logits are O(1));
    # a head cut one row off differs by ~0.1, checked below.
    torch.testing.assert_close(pruned, full[..., V - N_ACT :], rtol=1e-5, atol=1e-5)
    assert (pruned - full[..., V - N_ACT - 1 : V - 1]).abs().max() > 1e-2


def test_head_param_count_drops_by_vocab_over_actions() -> None:
    model = _llama()
    before = sum(p.numel() for p in model.get_output_embeddings().parameters())
    old_weight = model.get_output_embeddings().weight
    head = prune_lm_head(model, V - N_ACT, V)
    after = sum(p.numel() for p in head.parameters())
    assert model.get_output_embeddings() is head
    assert before / after == V / N_ACT
    assert head.weight.untyped_storage().data_ptr() != old_weight.untyped_storage().data_ptr()
    assert pruned_range(model) == (V - N_ACT, V)


def test_tied_embeddings_are_untied_and_kept_full() -> None:
    model = _llama(tied=True)
    emb = model.get_input_embeddings()
    assert model.get_output_embeddings().weight.data_ptr() == emb.weight.data_ptr()
    emb_before = emb.weight.detach().clone()
    head = prune_lm_head(model, V - N_ACT, V)
    model.tie_weights()  # must not re-tie: the config now says untied
    assert model.config.tie_word_embeddings is False
    assert model.get_input_embeddings().weight.shape == (V, D)
    assert torch.equal(model.get_input_embeddings().weight, emb_before)
    assert model.get_output_embeddings() is head and head.weight.shape == (N_ACT, D)
    assert head.weight.untyped_storage().data_ptr() != emb.weight.untyped_storage().data_ptr()
    assert torch.equal(head.weight, emb_before[V - N_ACT :])
    ids = torch.randint(0, V, (2, 5))  # every input id still embeds: the input table is full
    logits = model(input_ids=ids).logits
    assert logits.shape == (2, 5, N_ACT)
    logits.sum().backward()
    with torch.no_grad():
        head.weight.add_(1.0)
    assert torch.equal(model.get_input_embeddings().weight, emb_before)


class _HeadWithBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 10, bias=True)

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def set_output_embeddings(self, new: nn.Module) -> None:
        self.head = new


def test_bias_is_sliced_too() -> None:
    model = _HeadWithBias()
    x = torch.randn(3, 4)
    full = model.head(x)
    prune_lm_head(model, 6, 10)
    assert model.head.bias.shape == (4,)
    assert torch.allclose(model.head(x), full[:, 6:])


@pytest.mark.parametrize("frozen", [True, False])
def test_bias_keeps_requires_grad_of_the_head(frozen: bool) -> None:
    """A frozen head stays frozen after pruning, bias included (and a trainable one stays trainable)."""
    model = _HeadWithBias()
    model.head.requires_grad_(not frozen)
    prune_lm_head(model, 6, 10)
    assert model.head.weight.requires_grad is (not frozen)
    assert model.head.bias.requires_grad is (not frozen)


@pytest.mark.parametrize(("first", "last"), [(-1, 10), (10, 10), (20, 10), (0, V + 1)])
def test_bad_ids_raise(first: int, last: int) -> None:
    with pytest.raises(ValueError, match="first_id"):
        prune_lm_head(_llama(), first, last)


def test_pruning_twice_raises() -> None:
    model = _llama()
    prune_lm_head(model, V - N_ACT, V)
    with pytest.raises(ValueError, match="already pruned"):
        prune_lm_head(model, 0, 8)


@pytest.mark.parametrize("tied", [False, True])
def test_save_pretrained_round_trip(tmp_path, tied: bool) -> None:
    model = _llama(tied)
    prune_lm_head(model, V - N_ACT, V)
    model.save_pretrained(tmp_path)
    loaded = load_pruned_causal_lm(str(tmp_path)).eval()
    ids = torch.randint(0, V, (2, 6))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    assert pruned_range(loaded) == (V - N_ACT, V)
    assert loaded.get_input_embeddings().weight.shape == (V, D)


def test_unpruned_folder_loads_plainly(tmp_path) -> None:
    model = _llama()
    model.save_pretrained(tmp_path)
    loaded = load_pruned_causal_lm(str(tmp_path))
    assert pruned_range(loaded) is None
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
