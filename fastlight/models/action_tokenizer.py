"""Discretise continuous actions into bins and map bins onto the last vocabulary ids.

OpenVLA-style action tokenisation, as used by AcceRL (§lm_head pruning): every action dimension in
``[low, high]`` is cut into ``n_bins`` equal-width bins, and bin ``b`` is token ``first_id + b`` of the
**last** ``n_bins`` ids ``[first_id, last_id)`` of the vocabulary, so row ``b`` of an ``lm_head`` pruned
to them is the logit of bin ``b``. (OpenVLA itself counts down from the end of the vocabulary,
``vocab_size - 1 - b``; flip the pruned rows to load such weights.)

Shapes: every method is element-wise and keeps the input shape, e.g. ``[N, K]``.
"""

from __future__ import annotations

import torch
from torch import Tensor


class ActionTokenizer:
    """Continuous actions ``<->`` bin indices ``<->`` vocabulary token ids (AcceRL, OpenVLA).

    Args:
        vocab_size: size of the language model vocabulary; the action tokens are its last ``n_bins`` ids.
        n_bins: number of bins per action dimension, ``2 <= n_bins <= vocab_size``.
        low, high: action range; actions outside it are clipped into it.
        first_id: action tokens ``[first_id, first_id + n_bins)`` instead (``None``: ``vocab_size - n_bins``).
    """

    def __init__(
        self,
        vocab_size: int,
        n_bins: int = 256,
        low: float = -1.0,
        high: float = 1.0,
        first_id: int | None = None,
    ) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        if not 2 <= n_bins <= vocab_size:
            raise ValueError(f"n_bins must be in [2, vocab_size={vocab_size}], got {n_bins}")
        if not low < high:
            raise ValueError(f"low must be < high, got low={low}, high={high}")
        if first_id is not None and not 0 <= first_id <= vocab_size - n_bins:
            raise ValueError(
                f"action token ids [first_id, first_id + n_bins) = [{first_id}, {first_id + n_bins}) must "
                f"lie in the vocabulary [0, {vocab_size})"
            )
        self._first_id = int(vocab_size - n_bins if first_id is None else first_id)
        self.vocab_size, self.n_bins = int(vocab_size), int(n_bins)
        self.low, self.high = float(low), float(high)

    # ------------------------------------------------------------------ id range
    @property
    def first_id(self) -> int:
        """First action token id (inclusive): ``vocab_size - n_bins`` unless given."""
        return self._first_id

    @property
    def last_id(self) -> int:
        """End of the action token ids (exclusive): ``first_id + n_bins`` (``vocab_size`` by default)."""
        return self._first_id + self.n_bins

    @property
    def bin_width(self) -> float:
        """Width of one bin, ``(high - low) / n_bins``."""
        return (self.high - self.low) / self.n_bins

    # ------------------------------------------------------------------ actions <-> bins
    def encode(self, actions: Tensor) -> Tensor:
        """Float actions ``[...]`` -> long bins ``[...]`` in ``[0, n_bins)``; out-of-range is clipped.
        Raises ``ValueError`` on NaN actions (they have no bin)."""
        actions = torch.as_tensor(actions)
        if not actions.is_floating_point():
            actions = actions.float()
        if bool(torch.isnan(actions).any()):
            raise ValueError(f"ActionTokenizer.encode got NaN actions, shape {tuple(actions.shape)}")
        clipped = actions.clamp(self.low, self.high)
        scaled = (clipped - self.low) / (self.high - self.low) * self.n_bins
        return scaled.floor().long().clamp_(0, self.n_bins - 1)

    def decode(self, bins: Tensor) -> Tensor:
        """Long bins ``[...]`` -> float actions ``[...]`` at the bin centres (within half a bin)."""
        bins = self._check_bins(bins)
        return self.low + (bins.float() + 0.5) * self.bin_width

    def _check_bins(self, bins: Tensor) -> Tensor:
        bins = torch.as_tensor(bins)
        if bins.is_floating_point():
            raise ValueError(f"bins must be integers, got dtype {bins.dtype}")
        if bins.numel() and (int(bins.min()) < 0 or int(bins.max()) >= self.n_bins):
            raise ValueError(
                f"bins must be in [0, {self.n_bins}), got range [{int(bins.min())}, {int(bins.max())}]"
            )
        return bins.long()

    def __repr__(self) -> str:
        keys = ("vocab_size", "n_bins", "low", "high", "first_id")
        return f"ActionTokenizer({', '.join(f'{k}={getattr(self, k)}' for k in keys)})"
