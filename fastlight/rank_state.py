"""Per-rank state in a checkpoint that rank 0 alone writes, and its mapping onto another world size.

Most of a checkpoint is identical on every rank; some state is *per rank* (each rank's sampler counters,
its self-imitation buffer). It is gathered to rank 0 at save (:func:`gather_per_rank`) and stored as a
list, one entry per rank, next to rank 0's own values. On load with ``W`` ranks, new rank ``r`` takes the
old ranks ``j`` with ``j % W == r`` (:func:`old_ranks_for`); counters are summed over them
(:func:`counters_for_rank`), so the job's totals are kept whatever the new world size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

PER_RANK_KEY = "per_rank"

_local_only = False


@contextlib.contextmanager
def local_only() -> Iterator[None]:
    """Save without gathering (a survivor of a lost rank stores its own per-rank state only)."""
    global _local_only
    previous, _local_only = _local_only, True
    try:
        yield
    finally:
        _local_only = previous


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group; ``(0, 1)`` outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_per_rank(value: Any) -> list[Any]:
    """Every rank's ``value`` in rank order on rank 0 (``[value]`` on the others and at world size 1).
    A collective: every rank runs Lightning's checkpoint hooks."""
    rank, size = world()
    if size == 1 or _local_only:
        return [value]
    out: list[Any] | None = [None] * size if rank == 0 else None
    dist.gather_object(value, out, dst=0)
    if out is None:
        return [value]
    out[0] = value  # rank 0's own object, not its pickled copy: torch.save writes shared tensors once
    return out


def per_rank_entries(state: dict[str, Any], own: dict[str, Any]) -> list[Any]:
    """The saved ranks' entries of ``state``: its ``per_rank`` list, or ``[own]`` when it has none."""
    if (entries := state.get(PER_RANK_KEY)) is None:
        return [own]
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"--ckpt_path: the checkpoint's per-rank state is not a list of ranks: {entries!r}")
    return entries


def old_ranks_for(rank: int, world_size: int, saved_ranks: int) -> list[int]:
    """The old ranks whose state new rank ``rank`` (of ``world_size``) takes: ``j % world_size == rank``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside [0, {world_size})")
    return [j for j in range(saved_ranks) if j % world_size == rank]


def counters_for_rank(entries: list[dict[str, int]], rank: int, world_size: int) -> dict[str, int]:
    """Rank ``rank``'s counters: the sum over its old ranks (:func:`old_ranks_for`); every key of any
    entry is present (0 where a rank takes no old rank), so the sum over new ranks equals the old one."""
    keys = sorted({k for e in entries for k in e})
    mine = old_ranks_for(rank, world_size, len(entries))
    return {k: sum(int(entries[j].get(k, 0)) for j in mine) for k in keys}
