"""A local word-level tokenizer for task instructions, and fixed-length encoding of instructions.

VLA policies (AcceRL fine-tunes OpenVLA-OFT) read a natural-language instruction next to the
image. Without network access we cannot fetch a pretrained tokenizer, so
:func:`build_word_tokenizer` builds a ``tokenizers`` WordLevel vocabulary over the instruction set
(lower-cased, whitespace/punctuation split) with special tokens ``[PAD]=0``, ``[UNK]=1``,
``[BOS]=2``; every encoding starts with ``[BOS]``. :func:`build_instruction_tokenizer` wraps it
as a ``transformers`` ``PreTrainedTokenizerFast`` saved as a folder that
``transformers.AutoTokenizer.from_pretrained(save_dir)`` loads.

:func:`encode_instructions` (a ``transformers`` tokenizer) and :func:`encode_words` (the bare
``tokenizers`` one) turn sentences into right-padded ``ids [N, L]`` and ``mask [N, L]`` (1 = real
token), the ``instruction_ids`` / ``instruction_mask`` observation keys of
:class:`fastlight.vla.policy.VLAPolicy`; both give the same ids. The envs encode with
:func:`encode_words`, so that a sampler process that only steps envs never imports
``transformers`` (nor the PIL and Hugging Face hub modules it pulls in).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from fastlight.extras import import_extra

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

PAD, UNK, BOS = "[PAD]", "[UNK]", "[BOS]"
SPECIAL_TOKENS = (PAD, UNK, BOS)


def build_word_tokenizer(sentences: Iterable[str]) -> Tokenizer:
    """The WordLevel ``tokenizers.Tokenizer`` over ``sentences`` (``[PAD]`` 0, ``[UNK]`` 1, ``[BOS]`` 2,
    prepended to every encoding; words not seen map to ``[UNK]``). Imports ``tokenizers`` only.
    Raises ``ValueError`` if ``sentences`` is empty."""
    # The Meta-World envs encode with it: the metaworld extra installs tokenizers (so does vla).
    import_extra("tokenizers", extra="metaworld", what="the instruction tokenizer")
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    sentences = [str(s) for s in sentences]
    if not sentences:
        raise ValueError("an instruction tokenizer needs at least one sentence, got none")
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS), min_frequency=1)
    tok.train_from_iterator(sentences, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return tok


def as_pretrained_tokenizer(tok: Tokenizer, save_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """``tok`` (from :func:`build_word_tokenizer`, copied, not changed) as a ``transformers``
    ``PreTrainedTokenizerFast`` with ``pad_token=[PAD]``, ``unk_token=[UNK]``, ``bos_token=[BOS]``,
    right padding; saved to ``save_dir`` (a folder ``AutoTokenizer.from_pretrained`` loads) if given."""
    import_extra("transformers", extra="vla", what="the instruction tokenizer")
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, unk_token=UNK, bos_token=BOS)
    fast.padding_side = "right"
    if save_dir is not None:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        fast.save_pretrained(str(save_dir))
    return fast


def build_instruction_tokenizer(sentences: Iterable[str], save_dir: str | Path) -> PreTrainedTokenizerFast:
    """Build a WordLevel tokenizer over ``sentences``, save it to ``save_dir`` and return it.

    The returned object is a ``transformers.PreTrainedTokenizerFast`` with ``pad_token=[PAD]``
    (id 0), ``unk_token=[UNK]`` (id 1) and ``bos_token=[BOS]`` (id 2, prepended to every
    encoding); the folder reloads with ``AutoTokenizer.from_pretrained(save_dir)``. Words not
    seen in ``sentences`` map to ``[UNK]``. Raises ``ValueError`` if ``sentences`` is empty.
    """
    # transformers first: without it, the message names the vla extra (tokenizers comes with both).
    import_extra("transformers", extra="vla", what="the instruction tokenizer")
    return as_pretrained_tokenizer(build_word_tokenizer(sentences), save_dir)


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


def encode_words(tok: Tokenizer, sentences: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`encode_instructions` with the bare ``tokenizers`` tokenizer of :func:`build_word_tokenizer`:
    ``(ids [N, max_len], mask [N, max_len])`` int64, the same ids (it sets the truncation and padding
    ``PreTrainedTokenizerFast`` sets before the same ``encode_batch``). ``tok`` is not changed."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if isinstance(sentences, str):
        sentences = [sentences]
    if len(sentences) == 0:
        raise ValueError("encode_words needs at least one sentence, got none")
    from tokenizers import Tokenizer

    # A copy: the process's one tokenizer is shared by envs of any max_len (and threads).
    own = Tokenizer.from_str(tok.to_str())
    own.enable_truncation(max_len, stride=0, strategy="longest_first", direction="right")
    own.enable_padding(
        direction="right", pad_id=tok.token_to_id(PAD), pad_type_id=0, pad_token=PAD, length=max_len
    )
    enc = own.encode_batch(list(sentences), add_special_tokens=True)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    return ids, np.array([e.attention_mask for e in enc], dtype=np.int64)


def decode_instructions(tokenizer, ids: Tensor) -> list[str]:
    """``ids [N, L]`` -> the N sentences (special tokens dropped; text is lower-cased by the tokenizer)."""
    if ids.dim() != 2:
        raise ValueError(f"ids must be [N, L], got shape {tuple(ids.shape)}")
    return [tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in ids]


__all__ = [
    "SPECIAL_TOKENS", "as_pretrained_tokenizer", "build_instruction_tokenizer", "build_word_tokenizer",
    "decode_instructions", "encode_instructions", "encode_words",
]  # fmt: skip
