"""The fixed tensor order and flat per-dtype buckets of AcceRL's weight broadcast (AcceRL §weight sync).

AcceRL broadcasts "the model's trainable parameters and necessary buffers in a fixed sequence"; both
ends must derive the same sequence independently, from their own copy of the module. The order is:
parameters sorted by name, then *floating* buffers sorted by name (integer bookkeeping such as
``num_batches_tracked`` is left out). Tied parameters appear once. Tensors are then grouped by
dtype (first-appearance order) and packed back to back into flat buckets of at most ``bucket_mb``
MiB; a tensor larger than that gets a bucket of its own (tensors are never split). One bucket is
one collective, so a 100M-parameter model costs a handful of broadcasts instead of hundreds.

``signature`` is a 64-bit hash of (name, shape, dtype, bucket) for every slot, compared by the two
ends before any weights move.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Slot:
    """One tensor's place: ``buckets[bucket][offset : offset + numel]`` viewed as ``shape``."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    bucket: int
    offset: int
    numel: int


@dataclass(frozen=True)
class Bucket:
    dtype: torch.dtype
    numel: int
    slot_ids: tuple[int, ...]


@dataclass(frozen=True)
class BucketLayout:
    slots: tuple[Slot, ...]
    buckets: tuple[Bucket, ...]

    @property
    def nbytes(self) -> int:
        return sum(b.numel * _itemsize(b.dtype) for b in self.buckets)

    @property
    def signature(self) -> int:
        h = hashlib.blake2b(digest_size=8)
        for s in self.slots:
            h.update(f"{s.name}|{s.shape}|{s.dtype}|{s.bucket}|{s.offset};".encode())
        return int.from_bytes(h.digest(), "little", signed=True)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def sync_entries(module: nn.Module, include_buffers: bool = True) -> list[tuple[str, torch.Tensor]]:
    """The fixed order: parameters by name, then floating buffers by name."""
    params = sorted(module.named_parameters(), key=lambda kv: kv[0])
    if not include_buffers:
        return params
    floating = ((k, v) for k, v in module.named_buffers() if v.is_floating_point())
    buffers = sorted(floating, key=lambda kv: kv[0])
    return params + buffers


def plan_buckets(module: nn.Module | Sequence[tuple[str, torch.Tensor]], bucket_mb: float = 64.0,
                 include_buffers: bool = True) -> BucketLayout:
    """Assign every tensor of ``module`` (or of the given ``(name, tensor)`` list) a bucket slot."""
    if bucket_mb <= 0:
        raise ValueError(f"bucket_mb must be > 0, got {bucket_mb}")
    entries = sync_entries(module, include_buffers) if isinstance(module, nn.Module) else list(module)
    if not entries:
        raise ValueError("plan_buckets: the module has no parameters or floating buffers to sync")
    cap = int(bucket_mb * 2**20)
    order: dict[torch.dtype, list[int]] = {}
    for i, (_, t) in enumerate(entries):
        order.setdefault(t.dtype, []).append(i)
    slots: list[Slot | None] = [None] * len(entries)
    buckets: list[Bucket] = []
    for dtype, ids in order.items():
        size = _itemsize(dtype)
        current: list[int] = []
        fill = 0
        for i in ids:
            name, t = entries[i]
            n = t.numel()
            if current and (fill + n) * size > cap:
                buckets.append(Bucket(dtype, fill, tuple(current)))
                current, fill = [], 0
            slots[i] = Slot(name, tuple(t.shape), dtype, len(buckets), fill, n)
            current.append(i)
            fill += n
        buckets.append(Bucket(dtype, fill, tuple(current)))
    return BucketLayout(tuple(s for s in slots if s is not None), tuple(buckets))


def alloc_buckets(layout: BucketLayout, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """One flat tensor per bucket (at least one element, so empty buckets still broadcast)."""
    return [torch.zeros(max(b.numel, 1), dtype=b.dtype, device=device) for b in layout.buckets]


def bucket_views(layout: BucketLayout, buckets: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per slot, a view of its bucket region shaped like the tensor (slot order)."""
    return [buckets[s.bucket][s.offset : s.offset + s.numel].view(s.shape) for s in layout.slots]


def pack(layout: BucketLayout, tensors: Sequence[torch.Tensor], buckets: Sequence[torch.Tensor]) -> None:
    """Copy ``tensors`` (slot order) into ``buckets``."""
    _check(layout, tensors)
    with torch.no_grad():
        torch._foreach_copy_(bucket_views(layout, buckets), [t.detach() for t in tensors])


def unpack(layout: BucketLayout, buckets: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor]) -> None:
    """Copy the bucket contents into ``tensors`` (slot order) in place."""
    _check(layout, tensors)
    with torch.no_grad():
        torch._foreach_copy_([t.detach() for t in tensors], bucket_views(layout, buckets))


def _check(layout: BucketLayout, tensors: Sequence[torch.Tensor]) -> None:
    if len(tensors) != len(layout.slots):
        raise ValueError(f"expected {len(layout.slots)} tensors for this layout, got {len(tensors)}")
    for s, t in zip(layout.slots, tensors, strict=True):
        if tuple(t.shape) != s.shape or t.dtype != s.dtype:
            raise ValueError(f"{s.name}: layout has shape {s.shape} {s.dtype}, tensor has "
                             f"{tuple(t.shape)} {t.dtype}")
