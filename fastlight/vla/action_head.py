"""The action vocabulary of a VLA's language model: which ids are action tokens (``[first, last)``, the
last ``n_bins`` of the vocabulary unless ``action_token_ids`` names the range), and its head fitted to
them (AcceRL §lm_head pruning, :mod:`fastlight.vla.pruning`).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fastlight.models.action_tokenizer import ActionTokenizer
from fastlight.vla.pruning import prune_lm_head, pruned_range


def action_tokenizer(vocab_size: int, n_bins: int, token_ids: Sequence[int] | None) -> ActionTokenizer:
    """The action tokens: the last ``n_bins`` ids, or ``token_ids = [first, last)``."""
    if token_ids is None:
        return ActionTokenizer(vocab_size, n_bins)
    first, last = (int(i) for i in token_ids) if len(token_ids) == 2 else (None, None)
    if first is None or last - first != n_bins:
        raise ValueError(
            f"--model.policy.init_args.action_token_ids must be [first, last) with last - first = "
            f"--model.policy.init_args.n_bins ({n_bins}), got {list(token_ids)}"
        )
    return ActionTokenizer(vocab_size, n_bins, first_id=first)


def fit_head(backbone: nn.Module, tok: ActionTokenizer, prune_head: bool) -> None:
    """Prune ``backbone``'s head to the action rows of ``tok`` (``prune_head``), or check that an
    already pruned one matches them; ``ValueError`` naming both ranges otherwise."""
    rng = pruned_range(backbone)
    if rng is not None:
        if not prune_head or rng != (tok.first_id, tok.last_id):
            raise ValueError(
                f"backbone head is pruned to {list(rng)}; it needs prune_head=True and action ids "
                f"[{tok.first_id}, {tok.last_id}) (n_bins={tok.n_bins}), got prune_head={prune_head}"
            )
        return
    out = backbone.get_output_embeddings().out_features
    if out < tok.last_id:
        raise ValueError(f"lm_head has {out} rows, fewer than the vocab_size {tok.last_id}")
    if prune_head:
        prune_lm_head(backbone, tok.first_id, tok.last_id)
