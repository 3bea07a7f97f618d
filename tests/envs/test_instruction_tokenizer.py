"""The bare ``tokenizers`` WordLevel tokenizer the envs encode with gives the ids of the same
vocabulary as a ``transformers`` tokenizer (saved as a folder, reloaded with AutoTokenizer): the
transformers forms live here, for the comparison; the package encodes without transformers."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from fastlight.envs.instruction_tokens import BOS, PAD, UNK, build_word_tokenizer, encode_words
from fastlight.envs.instructions import instruction_words
from fastlight.vla.policy import VLAPolicy


def build_instruction_tokenizer(sentences: Iterable[str], save_dir: str | Path) -> PreTrainedTokenizerFast:
    """The WordLevel tokenizer over ``sentences`` as a ``PreTrainedTokenizerFast``, saved to ``save_dir``."""
    return as_pretrained(build_word_tokenizer(sentences), save_dir)


def as_pretrained(tok, save_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, unk_token=UNK, bos_token=BOS)
    fast.padding_side = "right"
    if save_dir is not None:
        fast.save_pretrained(str(save_dir))
    return fast


def instruction_tokenizer(extra: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    return as_pretrained(instruction_words(extra))


def encode_instructions(
    tokenizer, sentences: Sequence[str], max_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    enc = tokenizer(
        list(sentences), padding="max_length", truncation=True, max_length=max_len, return_tensors="pt"
    )
    return enc["input_ids"].long(), enc["attention_mask"].long()


def decode_instructions(tokenizer, ids: torch.Tensor) -> list[str]:
    return [tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in ids]


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


#: The MT10 instructions' ids (no padding) as the transformers tokenizer gave them before the envs
#: encoded with the bare ``tokenizers`` one: a checkpoint trained on those ids must read the same.
MT10_IDS = {
    "reach-v3": [2, 31, 3, 4, 28, 36, 3, 18],
    "push-v3": [2, 10, 3, 9, 33, 3, 4],
    "pick-place-v3": [2, 26, 35, 3, 9, 13, 27, 23, 14, 3, 4],
    "door-open-v3": [2, 5, 3, 17, 16, 30, 24, 19],
    "drawer-open-v3": [2, 5, 3, 7],
    "drawer-close-v3": [2, 10, 3, 7, 6],
    "button-press-topdown-v3": [2, 29, 3, 15, 8, 3, 34],
    "peg-insert-side-v3": [2, 21, 3, 25, 22, 3, 20, 8, 3, 32],
    "window-open-v3": [2, 11, 3, 12, 5],
    "window-close-v3": [2, 11, 3, 12, 6],
}


@pytest.mark.parametrize("max_len", [4, 8, 11, 16])  # truncating most, some, none (longest + [BOS]), padded
def test_bare_tokenizer_gives_the_transformers_ids_for_every_mt10_instruction(max_len) -> None:
    from fastlight.envs.instructions import INSTRUCTIONS

    sentences = list(INSTRUCTIONS.values())
    words, fast = instruction_words(), instruction_tokenizer()
    ids, mask = encode_words(words, sentences, max_len)
    want_ids, want_mask = encode_instructions(fast, sentences, max_len)
    assert ids.dtype == mask.dtype == np.int64 and ids.shape == mask.shape == (len(sentences), max_len)
    assert np.array_equal(ids, want_ids.numpy()) and np.array_equal(mask, want_mask.numpy())
    # ... and those are the ids from before, row by row (truncated, then right-padded with [PAD] 0).
    for row, row_mask, name in zip(ids, mask, INSTRUCTIONS, strict=True):
        real = MT10_IDS[name][:max_len]
        assert row.tolist() == real + [0] * (max_len - len(real)), name
        assert row_mask.tolist() == [1] * len(real) + [0] * (max_len - len(real)), name
    assert words.get_vocab_size() == len(fast) == 37
    # A tokenizer trained apart, saved and reloaded the transformers way, has the same vocabulary.
    with tempfile.TemporaryDirectory() as folder:
        build_instruction_tokenizer(sorted(set(sentences)), folder)
        loaded = AutoTokenizer.from_pretrained(folder)
    assert torch.equal(encode_instructions(loaded, sentences, max_len)[0], want_ids)


def test_bare_tokenizer_matches_transformers_on_words_it_never_saw() -> None:

    extra = ("Pick up the red block.", "open the fridge now please")  # sorted, as the env passes them
    sentences = [*extra, "reach the goal position with the gripper", "OPEN  the  Drawer!"]
    ids, mask = encode_words(instruction_words(extra), sentences, 6)
    want_ids, want_mask = encode_instructions(instruction_tokenizer(extra), sentences, 6)
    assert np.array_equal(ids, want_ids.numpy()) and np.array_equal(mask, want_mask.numpy())
    assert ids[:3].tolist() == [[2, 9, 13, 3, 38, 18], [2, 4, 3, 22, 30, 33], [2, 37, 3, 5, 34, 42]]
    assert int(ids[3, 4]) == 1  # "!" was never seen: [UNK]
    assert instruction_words(extra).get_vocab_size() == len(instruction_tokenizer(extra)) == 43
    with pytest.raises(ValueError, match="max_len"):
        encode_words(instruction_words(), ["open the drawer"], 0)
