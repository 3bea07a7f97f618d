"""An env's instructions in a backbone's own vocabulary: a table bound once, looked up by tensors.

Before any sampler starts, the env's distinct instruction rows and their sentences are tokenized once
with the model folder's tokenizer (:meth:`Retokenizer.bind`); at run time a batch's rows are found in
that table by tensor comparison (:func:`match_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from fastlight.vla.hf_vlm import has_tokenizer, load_tokenizer


def own_tokens(tokenizer: Any, sentences: Sequence[str], vocab_rows: int) -> tuple[Tensor, Tensor]:
    """``sentences`` (T of them) -> right-padded ``(ids [T, L'], mask [T, L'])`` (long) in
    ``tokenizer``'s vocabulary, special tokens as the tokenizer adds them (pad id 0, masked)."""
    if len(sentences) == 0:
        raise ValueError("the instruction table needs at least one sentence, got none")
    rows = [list(tokenizer(str(s))["input_ids"]) for s in sentences]
    width = max(max(len(r) for r in rows), 1)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r, dtype=torch.long), 1
    if int(ids.max()) >= vocab_rows:
        raise ValueError(
            f"the tokenizer gives id {int(ids.max())}, beyond the model's {vocab_rows} input embeddings"
        )
    return ids, mask


def table_keys(ids: Tensor, mask: Tensor) -> Tensor:
    """Rows ``[T, L]`` as lookup keys: ids where the mask is set, ``-1`` elsewhere (padding ignored)."""
    return torch.where(mask.bool(), ids.long(), torch.full_like(ids.long(), -1))


def match_rows(ids: Tensor, mask: Tensor, keys: Tensor) -> Tensor:
    """Index ``[N]`` into the table ``keys [T, L]`` of each row of ``ids`` / ``mask`` ``[N, L_in]``.

    Rows compare on their masked tokens only (``-1`` padding, either width). A row with no real token
    (a Rollout's padding step, masked out of every loss) maps to entry 0; any other row found nowhere
    in the table raises a one-line ``ValueError``.
    """
    x = table_keys(ids, mask)
    width = max(x.shape[1], keys.shape[1])
    x = nn.functional.pad(x, (0, width - x.shape[1]), value=-1)
    k = nn.functional.pad(keys.to(x.device), (0, width - keys.shape[1]), value=-1)
    hit = (x.unsqueeze(1) == k.unsqueeze(0)).all(-1)  # [N, T]
    found = hit.any(-1) | ~mask.bool().any(-1)
    if not bool(found.all()):
        row = ids[int((~found).nonzero()[0, 0])]
        raise ValueError(
            f"instruction_ids row {row.tolist()} is not one of the {keys.shape[0]} instructions the policy's "
            "table holds (bound from the env's instructions before sampling): the env emits an instruction "
            "it did not declare"
        )
    return hit.int().argmax(-1)


class Retokenizer(nn.Module):
    """Env instruction rows ``[N, L]`` -> the model's own tokens ``[N, L']``, through a table.

    The table is three non-persistent buffers (``row_keys``, ``own_ids``, ``own_mask``; ``None`` until
    :meth:`bind`): they travel with the policy (a copy, a pickled sampler's) and stay out of checkpoints.

    Args:
        path: the backbone folder; without a tokenizer there (or ``None``: a random Llama) nothing is
            re-tokenized and rows pass through unchanged.
    """

    def __init__(self, path: str | None) -> None:
        super().__init__()
        self.tokenizer_path = path if has_tokenizer(path) else None
        for name in ("row_keys", "own_ids", "own_mask"):
            self.register_buffer(name, None, persistent=False)

    @property
    def active(self) -> bool:
        """True when the folder has a tokenizer, so instructions are re-tokenized with it."""
        return self.tokenizer_path is not None

    def bind(
        self, sentences: Sequence[str], ids: Tensor, mask: Tensor, *, vocab_rows: int, device: torch.device
    ) -> bool:
        """Tokenize the env's ``sentences`` (T) once and key them by its rows ``ids`` / ``mask``
        ``[T, L]``; ``vocab_rows``: the model's input embeddings (a larger id is refused). Returns
        whether a table was bound (``False`` without a tokenizer)."""
        if self.tokenizer_path is None:
            return False
        ids, mask = torch.as_tensor(ids).long(), torch.as_tensor(mask).long()
        if ids.dim() != 2 or ids.shape != mask.shape or ids.shape[0] != len(sentences):
            raise ValueError(
                f"instruction table: {len(sentences)} sentences need ids and mask [{len(sentences)}, L], "
                f"got {tuple(ids.shape)} and {tuple(mask.shape)}"
            )
        own_ids, own_mask = own_tokens(load_tokenizer(self.tokenizer_path), list(sentences), vocab_rows)
        self.row_keys = table_keys(ids, mask).to(device)
        self.own_ids, self.own_mask = own_ids.to(device), own_mask.to(device)
        return True

    def forward(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Env rows -> own tokens by table lookup, or unchanged while no table is bound."""
        if self.row_keys is None:
            return ids, mask
        idx = match_rows(ids, mask, self.row_keys)
        return self.own_ids[idx], self.own_mask[idx]
