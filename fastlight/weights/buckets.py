"""The one pack / unpack of every weight path: AcceRL's fixed tensor order and flat per-dtype buckets
(AcceRL §weight sync).

AcceRL broadcasts "the model's trainable parameters and necessary buffers in a fixed sequence"; both
ends derive it independently (:func:`sync_entries`, :func:`plan_buckets`). Tensors are grouped by dtype
(first-appearance order) and packed back to back into flat buckets of at most ``bucket_mb`` MiB (never
split); one bucket is one collective. Every dtype travels as itself, so delivered weights are bitwise
the trainer's.

A tensor of at least ``direct_mb`` MiB is *direct* (``bucket == DIRECT``): broadcast as itself, saving
a pack and an unpack copy. The broadcast's default ``direct_mb = bucket_mb / 4`` keeps tensors of a few
MiB packed and caps the direct collectives at 4 per ``bucket_mb`` of weights. ``signature`` hashes
(name, shape, dtype, bucket, offset) of every slot; the two ends compare it before any weights move.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fastlight.weights.publisher import WeightSyncError
from fastlight.weights.sharded import full

DIRECT = -1
"""``Slot.bucket`` of a tensor that is broadcast as itself instead of packed."""
ONE_BUCKET_PER_DTYPE_MB = 2.0**40
"""``bucket_mb`` of the paths without collectives (larger than any model): one flat bucket per dtype."""


@dataclass(frozen=True)
class Slot:
    """One tensor's place: ``buckets[bucket][offset : offset + numel]`` viewed as ``shape``, or
    ``bucket == DIRECT`` (offset 0): sent as itself."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    bucket: int
    offset: int
    numel: int

    @property
    def direct(self) -> bool:
        return self.bucket == DIRECT


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
        """Bytes of all synced tensors, packed and direct."""
        return sum(s.numel * _itemsize(s.dtype) for s in self.slots)

    @functools.cached_property
    def direct(self) -> tuple[int, ...]:
        """Ids of the direct slots, in slot order."""
        return tuple(i for i, s in enumerate(self.slots) if s.direct)

    @functools.cached_property
    def packed(self) -> tuple[int, ...]:
        """Ids of the packed (not direct) slots, in slot order."""
        return tuple(i for i, s in enumerate(self.slots) if not s.direct)

    @property
    def signature(self) -> int:
        h = hashlib.blake2b(digest_size=8)
        for s in self.slots:
            h.update(f"{s.name}|{s.shape}|{s.dtype}|{s.bucket}|{s.offset};".encode())
        return int.from_bytes(h.digest(), "little", signed=True)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def sync_entries(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """What every weight path publishes, in its fixed order: the *trainable* parameters (``requires_grad``)
    by name, then the floating buffers by name (tied parameters once). A frozen parameter (a LoRA run's
    base weights) never changes, so it travels once, with the policy copy. Buffers are sent whatever
    their ``requires_grad`` (a trainer changes normalisation statistics without gradients). A policy
    sharded with fsdp2 publishes whole tensors, gathered here (:func:`fastlight.weights.sharded.full`)
    on every rank at once."""
    params = sorted(((k, full(v)) for k, v in module.named_parameters() if v.requires_grad),
                    key=lambda kv: kv[0])  # fmt: skip
    floating = ((k, v) for k, v in module.named_buffers() if v.is_floating_point())
    return params + sorted(floating, key=lambda kv: kv[0])


def plan_buckets(
    module: nn.Module | Sequence[tuple[str, torch.Tensor]],
    bucket_mb: float = 64.0,
    direct_mb: float | None = None,
) -> BucketLayout:
    """Assign every tensor of ``module`` (or of the given ``(name, tensor)`` list) a bucket slot, or a
    direct slot when it holds at least ``direct_mb`` MiB (``None``: pack everything); names, shapes and
    dtypes alone decide."""
    if bucket_mb <= 0:
        raise ValueError(f"bucket_mb must be > 0, got {bucket_mb}")
    if direct_mb is not None and direct_mb <= 0:
        raise ValueError(f"direct_mb must be > 0 (or None: pack everything), got {direct_mb}")
    entries = sync_entries(module) if isinstance(module, nn.Module) else list(module)
    cap = int(bucket_mb * 2**20)
    direct_min = None if direct_mb is None else direct_mb * 2**20
    order: dict[torch.dtype, list[int]] = {}
    slots: list[Slot | None] = [None] * len(entries)
    for i, (name, t) in enumerate(entries):
        nbytes = t.numel() * _itemsize(t.dtype)
        if direct_min is not None and nbytes > 0 and nbytes >= direct_min:
            slots[i] = Slot(name, tuple(t.shape), t.dtype, DIRECT, 0, t.numel())
        else:
            order.setdefault(t.dtype, []).append(i)
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


def bucket_views(layout: BucketLayout, buckets: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """Per slot, a view of its bucket region shaped like the tensor; ``None`` for a direct slot."""
    return [None if s.direct else buckets[s.bucket][s.offset : s.offset + s.numel].view(s.shape)
            for s in layout.slots]  # fmt: skip


def layout_tensors(module: nn.Module, layout: BucketLayout) -> list[torch.Tensor]:
    """``module``'s published tensors (the objects themselves) in ``layout``'s slot order. Raises
    :class:`~fastlight.weights.publisher.WeightSyncError` if they are not the ones it was planned for
    (names, shapes, dtypes), rather than sending misaligned bytes."""
    entries = sync_entries(module)
    names = [s.name for s in layout.slots]
    if [k for k, _ in entries] != names:
        mine = {k for k, _ in entries}
        raise WeightSyncError(
            "weight sync: the published tensors changed since the layout was planned (a parameter's "
            f"requires_grad or the module changed): now also {sorted(mine - set(names))[:4]}, no longer "
            f"{sorted(set(names) - mine)[:4]}"
        )
    for s, (_, t) in zip(layout.slots, entries, strict=True):
        if tuple(t.shape) != s.shape or t.dtype != s.dtype:
            raise WeightSyncError(
                f"weight sync: {s.name} changed since the layout was planned: "
                f"expected {(s.shape, s.dtype)}, got {(tuple(t.shape), t.dtype)}"
            )
    return [t for _, t in entries]


class PackedWeights:
    """A layout's flat buckets and every slot's view into them (one copy per packed tensor; ``bucket``
    limits either to one bucket). Pickled, it carries its buckets (shared memory or CUDA IPC handles)
    and rebuilds the views where it lands."""

    def __init__(self, layout: BucketLayout, buckets: Sequence[torch.Tensor]) -> None:
        if len(buckets) != len(layout.buckets):
            raise ValueError(f"expected {len(layout.buckets)} buckets for this layout, got {len(buckets)}")
        self.layout, self.buckets = layout, list(buckets)
        self._views: list[torch.Tensor | None] | None = None

    @classmethod
    def alloc(
        cls, layout: BucketLayout, device: torch.device | str = "cpu", *, shared: bool = False
    ) -> PackedWeights:
        """Zeroed buckets on ``device``; ``shared``: in host shared memory."""
        buckets = alloc_buckets(layout, device)
        return cls(layout, [b.share_memory_() for b in buckets] if shared else buckets)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_views": None}

    @property
    def views(self) -> list[torch.Tensor | None]:
        """Per slot, its region shaped like the tensor (``None`` for a direct slot)."""
        if self._views is None:
            self._views = bucket_views(self.layout, self.buckets)
        return self._views

    def pack(self, tensors: Sequence[torch.Tensor], bucket: int | None = None) -> None:
        """Copy ``tensors`` (slot order) into the buckets (only bucket ``bucket`` if given)."""
        ids, views = self._ids(tensors, bucket), self.views
        _copy([views[i] for i in ids], [tensors[i] for i in ids])  # packed slots: never None

    def unpack(self, tensors: Sequence[torch.Tensor], bucket: int | None = None) -> None:
        """Copy the buckets (only bucket ``bucket`` if given) into ``tensors`` (slot order) in place."""
        ids, views = self._ids(tensors, bucket), self.views
        _copy([tensors[i] for i in ids], [views[i] for i in ids])  # packed slots: never None

    def _ids(self, tensors: Sequence[torch.Tensor], bucket: int | None) -> Sequence[int]:
        if len(tensors) != len(self.layout.slots):
            raise ValueError(f"expected {len(self.layout.slots)} tensors for this layout, got {len(tensors)}")
        return self.layout.packed if bucket is None else self.layout.buckets[bucket].slot_ids


def _copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    with torch.no_grad():
        if dst and len({t.device for t in dst} | {t.device for t in src}) == 1:
            torch._foreach_copy_(dst, src)
        else:  # across devices (a GPU trainer into host shared memory): one copy_ each
            for d, s in zip(dst, src, strict=True):
                d.copy_(s)
