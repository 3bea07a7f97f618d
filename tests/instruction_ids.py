"""Instruction ids for tests that feed a VLA directly: the env's own encoding, as torch tensors."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fastlight.envs.instruction_tokens import encode_words
from fastlight.envs.instructions import instruction_words


def instruction_ids(
    sentences: Sequence[str], max_len: int, extra: tuple[str, ...] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [N, max_len], mask [N, max_len])`` long: the MT10 vocabulary plus ``extra``, as envs encode."""
    ids, mask = encode_words(instruction_words(extra), list(sentences), max_len)
    return torch.from_numpy(ids), torch.from_numpy(mask)
