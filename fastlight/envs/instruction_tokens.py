"""A local word-level tokenizer for task instructions, and fixed-length encoding of instructions.

VLA policies (AcceRL fine-tunes OpenVLA-OFT) read a natural-language instruction next to the
image. Without network access we cannot fetch a pretrained tokenizer, so
:func:`build_instruction_tokenizer` builds a ``tokenizers`` WordLevel vocabulary over the
instruction set (lower-cased, whitespace/punctuation split) with special tokens
``[PAD]=0``, ``[UNK]=1``, ``[BOS]=2``; every encoding starts with ``[BOS]``. It is saved as a
folder that ``transformers.AutoTokenizer.from_pretrained(save_dir)`` loads as a fast tokenizer
(``PreTrainedTokenizerFast``).

:func:`encode_instructions` turns sentences into right-padded ``ids [N, L]`` (long) and
``mask [N, L]`` (long, 1 = real token), the ``instruction_ids`` / ``instruction_mask``
observation keys of :class:`fastlight.vla.policy.VLAPolicy`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from torch import Tensor

from fastlight.extras import import_extra

PAD, UNK, BOS = "[PAD]", "[UNK]", "[BOS]"
SPECIAL_TOKENS = (PAD, UNK, BOS)


def build_instruction_tokenizer(sentences: Iterable[str], save_dir: str | Path):
    """Build a WordLevel tokenizer over ``sentences``, save it to ``save_dir`` and return it.

    The returned object is a ``transformers.PreTrainedTokenizerFast`` with ``pad_token=[PAD]``
    (id 0), ``unk_token=[UNK]`` (id 1) and ``bos_token=[BOS]`` (id 2, prepended to every
    encoding); the folder reloads with ``AutoTokenizer.from_pretrained(save_dir)``. Words not
    seen in ``sentences`` map to ``[UNK]``. Raises ``ValueError`` if ``sentences`` is empty.
    """
    import_extra("tokenizers", extra="vla", what="the instruction tokenizer")
    import_extra("transformers", extra="vla", what="the instruction tokenizer")
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    sentences = [str(s) for s in sentences]
    if not sentences:
        raise ValueError("build_instruction_tokenizer needs at least one sentence, got none")
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS), min_frequency=1)
    tok.train_from_iterator(sentences, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, unk_token=UNK, bos_token=BOS)
    fast.padding_side = "right"
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(save_dir))
    return fast


def encode_instructions(tokenizer, sentences: Sequence[str], max_len: int) -> tuple[Tensor, Tensor]:
    """Sentences -> ``(ids [N, max_len] long, mask [N, max_len] long)``, right-padded and truncated.

    ``tokenizer`` is any ``transformers`` tokenizer with a pad token (e.g. the one from
    :func:`build_instruction_tokenizer` or ``AutoTokenizer.from_pretrained(folder)``).
    Raises ``ValueError`` for ``max_len < 1`` or an empty ``sentences``.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if isinstance(sentences, str):
        sentences = [sentences]
    if len(sentences) == 0:
        raise ValueError("encode_instructions needs at least one sentence, got none")
    if tokenizer.padding_side != "right":
        raise ValueError(f"tokenizer.padding_side must be 'right', got {tokenizer.padding_side!r}")
    enc = tokenizer(
        list(sentences), padding="max_length", truncation=True, max_length=max_len, return_tensors="pt"
    )
    return enc["input_ids"].long(), enc["attention_mask"].long()


def decode_instructions(tokenizer, ids: Tensor) -> list[str]:
    """``ids [N, L]`` -> the N sentences (special tokens dropped; text is lower-cased by the tokenizer)."""
    if ids.dim() != 2:
        raise ValueError(f"ids must be [N, L], got shape {tuple(ids.shape)}")
    return [tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in ids]


__all__ = ["build_instruction_tokenizer", "encode_instructions", "decode_instructions", "SPECIAL_TOKENS"]
