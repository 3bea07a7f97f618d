"""Whole tensors from sharded ones: what a publish sends and what a rank's checks read, under
``--trainer.strategy fsdp2`` (:mod:`fastlight.modules.sharding`), where parameters are DTensors."""

from __future__ import annotations

import sys

from torch import Tensor


def _dtensor_class() -> type | None:
    # A sampler never imports torch.distributed.tensor (a DTensor exists only where it was imported).
    module = sys.modules.get("torch.distributed.tensor")
    return None if module is None else module.DTensor


def local(t: Tensor) -> Tensor:
    """``t`` itself, or this rank's shard of a sharded (DTensor) one (no communication)."""
    dtensor = _dtensor_class()
    return t.to_local() if dtensor is not None and isinstance(t, dtensor) else t


def full(t: Tensor) -> Tensor:
    """``t`` itself, or the whole tensor of a sharded (DTensor) one: an all-gather that every rank of
    its mesh must run at the same point (a publish, which every rank makes before each batch)."""
    dtensor = _dtensor_class()
    return t.full_tensor() if dtensor is not None and isinstance(t, dtensor) else t
