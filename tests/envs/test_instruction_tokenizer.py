"""WordLevel instruction tokenizer saved as a folder and reloaded with AutoTokenizer."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from fastlight.envs.instruction_tokens import (
    build_instruction_tokenizer,
    decode_instructions,
    encode_instructions,
)
from fastlight.vla.policy import VLAPolicy

SENTENCES = ["Pick up the red block.", "open the drawer", "push the button to the left"]


def test_round_trip_through_auto_tokenizer(tmp_path) -> None:
    built = build_instruction_tokenizer(SENTENCES, tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert isinstance(loaded, PreTrainedTokenizerFast)
    ids, mask = encode_instructions(loaded, SENTENCES, max_len=8)
    ids_b, mask_b = encode_instructions(built, SENTENCES, max_len=8)
    assert torch.equal(ids, ids_b) and torch.equal(mask, mask_b)
    assert ids.shape == mask.shape == (3, 8) and ids.dtype == mask.dtype == torch.long
    assert decode_instructions(loaded, ids) == [
        "pick up the red block .",
        "open the drawer",
        "push the button to the left",
    ]
    assert (loaded.pad_token_id, loaded.unk_token_id, loaded.bos_token_id) == (0, 1, 2)
    assert bool((ids[:, 0] == 2).all())
    assert torch.equal(mask[1], torch.tensor([1, 1, 1, 1, 0, 0, 0, 0]))
    assert bool((ids[mask == 0] == 0).all())


def test_unknown_words_and_truncation(tmp_path) -> None:
    tok = build_instruction_tokenizer(SENTENCES, tmp_path)
    ids, mask = encode_instructions(tok, ["open the fridge now please"], max_len=4)
    assert ids.shape == (1, 4) and bool(mask.all())
    assert ids[0, 3].item() == tok.unk_token_id


def test_bad_arguments_raise(tmp_path) -> None:
    with pytest.raises(ValueError, match="at least one sentence"):
        build_instruction_tokenizer([], tmp_path)
    tok = build_instruction_tokenizer(SENTENCES, tmp_path)
    with pytest.raises(ValueError, match="max_len"):
        encode_instructions(tok, SENTENCES, max_len=0)


def test_encoded_instructions_drive_the_policy(tmp_path) -> None:
    tok = build_instruction_tokenizer(SENTENCES, tmp_path)
    ids, mask = encode_instructions(tok, SENTENCES, max_len=8)
    policy = VLAPolicy(vocab_size=300, hidden_size=16, intermediate_size=32, n_bins=16, max_text_len=8)
    out = policy.act({"instruction_ids": ids, "instruction_mask": mask})
    assert out.actions.shape == (3, 4) and out.values.shape == (3,)
