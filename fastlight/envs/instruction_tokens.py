"""A local word-level tokenizer for task instructions, and fixed-length encoding of instructions.

:func:`encode_words` gives the ``instruction_ids`` / ``instruction_mask`` observation keys of
:class:`fastlight.vla.policy.VLAPolicy`, the ids a ``transformers`` ``PreTrainedTokenizerFast`` would
give, without importing ``transformers`` into a sampler that only steps envs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from fastlight.extras import import_extra

if TYPE_CHECKING:
    from tokenizers import Tokenizer

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


def encode_words(tok: Tokenizer, sentences: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Sentences -> ``(ids [N, max_len], mask [N, max_len])`` int64, right-padded and truncated as a
    ``transformers`` ``PreTrainedTokenizerFast`` would, with the tokenizer of :func:`build_word_tokenizer`
    (not changed). Raises ``ValueError`` for ``max_len < 1`` or an empty ``sentences``."""
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


__all__ = ["SPECIAL_TOKENS", "build_word_tokenizer", "encode_words"]
