"""Trainer -> inference-worker weight broadcast over a dedicated two-rank group (AcceRL §weight sync).

AcceRL ("NCCL weight synchronization"): the trainer and one inference worker form an *independent*
group (:mod:`fastlight.weights.group`); after each update the trainer broadcasts the trainable
parameters and the necessary buffers **in a fixed sequence** (:mod:`fastlight.weights.buckets`) and
the worker overwrites its live weights **in place**. An int64 header ``[version, n_collectives,
signature, 0]`` goes first and the worker acks with its new version last, so
:meth:`WeightBroadcaster.broadcast` returns once the worker's weights are in place. How the tensors
travel in between is a :class:`Transport` (``benchmarks.sync.per_tensor`` plugs in a baseline).

*Inference Drain*: :meth:`WeightBroadcaster.signal_drain` bumps a counter in the group's store that
:meth:`WeightReceiver.sync_pending` reads between forward batches. A peer that dies or stalls makes
the waiting side raise :class:`WeightSyncError` instead of hanging; the endpoint is unusable after
it (its model may hold a mix of old and new weights). Two processes on **one** GPU cannot form an
NCCL group: :class:`WeightSyncError` at construction (use the CUDA IPC double buffer).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol

import torch
from torch import nn

from fastlight.weights.buckets import PackedWeights, layout_tensors, plan_buckets
from fastlight.weights.group import (
    _PREFIX,
    TRAINER_RANK,
    WORKER_RANK,
    SyncGroup,
    SyncGroupConfig,
    choose_backend,
    free_port,
)
from fastlight.weights.publisher import SyncStats, WeightSyncError

__all__ = [
    "BUCKETED", "TRAINER_RANK", "WORKER_RANK", "BucketTransport", "LazyBroadcaster", "SyncEndpoint",
    "SyncGroupConfig", "Transport", "WeightBroadcaster", "WeightReceiver", "WeightSyncError",
    "choose_backend", "free_port",
]  # fmt: skip

DIRECT_FRACTION = 0.25  # default direct_mb = bucket_mb * DIRECT_FRACTION (see BucketTransport)


def _tensors(module: nn.Module, endpoint: SyncEndpoint) -> list[torch.Tensor]:
    """Detached: a direct slot is broadcast from and into the tensor itself."""
    return [t.detach() for t in layout_tensors(module, endpoint.layout)]


class SyncEndpoint:
    """One end of the group (rank ``RANK``): the module's fixed layout and its flat buckets (``packed``).
    ``direct_mb=None`` means ``bucket_mb * DIRECT_FRACTION``; ``name=None`` means ``NAME``."""

    RANK: int
    NAME: str

    def __init__(
        self,
        module: nn.Module,
        config: SyncGroupConfig,
        *,
        bucket_mb: float = 64.0,
        name: str | None = None,
        direct_mb: float | None = None,
    ) -> None:
        self.module = module
        direct_mb = bucket_mb * DIRECT_FRACTION if direct_mb is None else direct_mb
        self.layout = plan_buckets(module, bucket_mb, direct_mb=direct_mb)
        device = layout_tensors(module, self.layout)[0].device
        self.group = SyncGroup(config, self.RANK, name or self.NAME, device)
        self.packed = PackedWeights.alloc(self.layout, device)
        self.version = -1
        self._handshake()

    def _handshake(self) -> None:
        """Rank 0 sends its layout signature, rank 1 answers match/mismatch; both raise on mismatch."""
        g, lay = self.group, self.layout
        mine = torch.tensor(
            [lay.signature, len(lay.buckets), len(lay.direct), lay.nbytes], dtype=torch.int64, device=g.device
        )
        theirs = mine.clone()
        g.guard("handshake", lambda: g.bcast(theirs, TRAINER_RANK).wait())
        ok = torch.tensor([int(torch.equal(mine, theirs))], dtype=torch.int64, device=g.device)
        g.guard("handshake", lambda: g.bcast(ok, WORKER_RANK).wait())
        if not int(ok.item()):
            raise WeightSyncError(
                f"weight sync layout mismatch between {g.name} and {g.peer}: "
                f"[signature, buckets, direct, bytes] {mine.tolist()} vs {theirs.tolist()}"
            )

    def close(self) -> None:
        self.group.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Transport(Protocol):
    """How one sync's tensors travel between the header and the ack; both ends use the same one."""

    name: str

    def collectives(self, endpoint: SyncEndpoint) -> int: ...

    def send(self, endpoint: SyncEndpoint, tensors: list[torch.Tensor]) -> None: ...

    def recv(self, endpoint: SyncEndpoint, tensors: list[torch.Tensor]) -> None: ...


class BucketTransport:
    """Direct tensors as themselves, the rest in flat per-dtype buckets; one collective each.

    Order (both ends): the direct tensors in slot order, then the buckets, all issued async: the
    trainer packs bucket b while earlier ones are in flight; the worker receives direct tensors into
    its live ones and unpacks bucket b while b+1 arrives. A non-contiguous direct tensor goes through
    a contiguous temporary (strides may differ between the two ends).
    """

    name = "bucketed"

    def collectives(self, endpoint: SyncEndpoint) -> int:
        return len(endpoint.layout.direct) + len(endpoint.layout.buckets)

    def send(self, endpoint: SyncEndpoint, tensors: list[torch.Tensor]) -> None:
        g, lay = endpoint.group, endpoint.layout
        sent = [tensors[i].contiguous() for i in lay.direct]  # kept alive until the waits
        works = [g.bcast(t, TRAINER_RANK) for t in sent]
        for b, buf in enumerate(endpoint.packed.buckets):
            endpoint.packed.pack(tensors, bucket=b)
            works.append(g.bcast(buf, TRAINER_RANK))
        for w in works:
            w.wait()

    def recv(self, endpoint: SyncEndpoint, tensors: list[torch.Tensor]) -> None:
        g, lay = endpoint.group, endpoint.layout
        into = [
            tensors[i]
            if tensors[i].is_contiguous()
            else torch.empty_like(tensors[i], memory_format=torch.contiguous_format)
            for i in lay.direct
        ]
        direct = [g.bcast(t, TRAINER_RANK) for t in into]
        works = [g.bcast(buf, TRAINER_RANK) for buf in endpoint.packed.buckets]
        for b, w in enumerate(works):  # unpack b while b+1 arrives
            w.wait()
            endpoint.packed.unpack(tensors, bucket=b)
        for w, i, t in zip(direct, lay.direct, into, strict=True):
            w.wait()
            if t is not tensors[i]:
                tensors[i].copy_(t)


BUCKETED = BucketTransport()


class WeightBroadcaster(SyncEndpoint):
    """Trainer side (rank 0) of AcceRL's broadcast group; hosts the group's ``TCPStore``. The layout
    is fixed at construction; ``syncs`` counts completed broadcasts."""

    RANK, NAME = TRAINER_RANK, "trainer"
    syncs = 0
    _announced = 0

    def signal_drain(self) -> None:
        """Inference Drain: tell the worker a sync is coming (idempotent until that sync runs)."""
        if self._announced <= self.syncs:
            g = self.group
            g.guard("drain signal", lambda: g.store.add(f"{_PREFIX}/announced", 1))
            self._announced = self.syncs + 1

    def broadcast(
        self, version: int, module: nn.Module | None = None, *, transport: Transport = BUCKETED
    ) -> SyncStats:
        """Send ``module``'s (default: the layout's module) current values as ``version`` through
        ``transport``; returns once the worker acked."""
        g, lay = self.group, self.layout
        t0 = time.perf_counter()
        self.signal_drain()
        tensors = _tensors(module if module is not None else self.module, self)
        n = transport.collectives(self)
        header = torch.tensor([version, n, lay.signature, 0], dtype=torch.int64, device=g.device)
        g.guard("header broadcast", lambda: g.bcast(header, TRAINER_RANK).wait())
        with torch.no_grad():
            g.guard(f"{transport.name} broadcast", lambda: transport.send(self, tensors))
        ack = torch.tensor([-1], dtype=torch.int64, device=g.device)
        g.guard("ack", lambda: g.bcast(ack, WORKER_RANK).wait())
        g.finish()
        if int(ack.item()) != version:
            raise WeightSyncError(f"weight sync: {g.peer} acked version {int(ack.item())}, sent {version}")
        self.version = version
        self.syncs += 1
        return SyncStats(version, transport.name, (time.perf_counter() - t0) * 1e3, lay.nbytes, n)


class LazyBroadcaster:
    """A trainer's end of a broadcast group whose :class:`WeightBroadcaster` is built at the first
    publish, from the live policy (so its buckets sit on the trainer's device); a drain before it is
    a no-op."""

    def __init__(self, config: SyncGroupConfig, bucket_mb: float) -> None:
        self.config, self.bucket_mb = config, bucket_mb
        self.broadcaster: WeightBroadcaster | None = None

    def request_drain(self) -> None:
        if self.broadcaster is not None:
            self.broadcaster.signal_drain()

    def publish(self, policy: nn.Module, version: int) -> SyncStats:
        """Broadcast ``policy``'s weights as ``version``; returns once the worker acked them
        (``trainer_wait_ms``: the whole call, the rendezvous at the first one included)."""
        t0 = time.perf_counter()
        if self.broadcaster is None:
            self.broadcaster = WeightBroadcaster(policy, self.config, bucket_mb=self.bucket_mb)
        stats = self.broadcaster.broadcast(version, policy)
        return dataclasses.replace(stats, trainer_wait_ms=1000.0 * (time.perf_counter() - t0))

    def close(self) -> None:
        if self.broadcaster is not None:
            self.broadcaster.close()
            self.broadcaster = None


class WeightReceiver(SyncEndpoint):
    """Inference-worker side (rank 1): ``receive`` writes into the live module's tensors in place
    (parameters keep their identity and storage) and returns the version."""

    RANK, NAME = WORKER_RANK, "inference-worker"
    received = 0

    def sync_pending(self) -> bool:
        """True once the trainer announced a sync (drain signal) this worker has not received yet."""
        g = self.group
        return int(g.guard("drain poll", lambda: g.store.add(f"{_PREFIX}/announced", 0))) > self.received

    def receive(self, module: nn.Module | None = None, *, transport: Transport = BUCKETED) -> int:
        """Join the next broadcast (same ``transport`` as the trainer's); returns its version."""
        g, lay = self.group, self.layout
        tensors = _tensors(module if module is not None else self.module, self)
        header = torch.zeros(4, dtype=torch.int64, device=g.device)
        g.guard("header broadcast", lambda: g.bcast(header, TRAINER_RANK).wait())
        version, n, signature, _ = (int(x) for x in header.tolist())
        expect = transport.collectives(self)
        if signature != lay.signature or n != expect:
            g.broken = "header mismatch"
            raise WeightSyncError(
                f"weight sync header from {g.peer} does not match {g.name}'s layout: "
                f"{header.tolist()} vs signature {lay.signature}, {expect} collectives"
            )
        with torch.no_grad():
            g.guard(f"{transport.name} broadcast", lambda: transport.recv(self, tensors))
        g.finish()
        ack = torch.tensor([version], dtype=torch.int64, device=g.device)
        g.guard("ack", lambda: g.bcast(ack, WORKER_RANK).wait())
        self.version = version
        self.received += 1
        return version
