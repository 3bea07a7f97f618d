"""Trainer -> inference-worker weight broadcast over a dedicated two-rank group (AcceRL §weight sync).

AcceRL ("NCCL weight synchronization") has the trainer-side source and one inference worker form
an *independent* broadcast group; after each update the trainer broadcasts the trainable
parameters and the necessary buffers **in a fixed sequence** and the worker overwrites its live
weights **in place** -- no Python serialization, no host object store, no checkpoint file. Its
*Inference Drain* has the trainer signal the worker shortly before the update ends, so the worker
finishes its in-flight forward, schedules no new one, and is already waiting in the broadcast.

Here:

- :class:`SyncGroupConfig` names the group: its own ``TCPStore`` at ``host:port`` (rank 0 = the
  trainer hosts it), a backend (``"nccl"`` when the two ends hold their weights on two different
  CUDA devices, else ``"gloo"``; :func:`choose_backend`) and a timeout. The backend object is
  built directly (``ProcessGroupGloo`` / ``ProcessGroupNCCL`` over a ``PrefixStore``), so it neither needs nor
  touches the default group that Lightning's DDP creates with ``init_process_group``.
- The order is fixed (:mod:`fastlight.weights.buckets`): parameters sorted by name, then
  floating buffers sorted by name; tensors are packed into flat per-dtype buckets of at most
  ``bucket_mb`` and each bucket is one collective. An int64 header
  ``[version, n_collectives, signature, 0]`` goes first, and the worker acks with its new
  version last, so :meth:`WeightBroadcaster.broadcast` returns once the worker's weights are in
  place. How the tensors travel between header and ack is a :class:`Transport` (the extension
  hook; :data:`BUCKETED` is the only one used in training, and ``fastlight.bench.per_tensor``
  plugs in the one-collective-per-tensor baseline).
- Drain: :meth:`WeightBroadcaster.signal_drain` bumps a counter in the group's store;
  :meth:`WeightReceiver.sync_pending` (checked by the worker between forward batches) tells it to
  stop scheduling and call :meth:`WeightReceiver.receive`.
- A peer that dies or stalls makes the waiting side raise :class:`WeightSyncError`, naming the
  peer and the timeout, instead of hanging. After an error the endpoint is unusable (its model may
  hold a mix of old and new weights) and the worker should be restarted.

Two processes on **one** GPU cannot form an NCCL group (NCCL rejects duplicate devices); use CUDA
IPC (``torch.multiprocessing`` shares CUDA tensors) for same-GPU sync. This is detected at
construction and raised as :class:`WeightSyncError`.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from fastlight.weights.buckets import BucketLayout, alloc_buckets, bucket_views, plan_buckets
from fastlight.weights.publisher import SyncStats

TRAINER_RANK, WORKER_RANK = 0, 1
_PREFIX = "fastlight/weight_sync"


class WeightSyncError(RuntimeError):
    """A weight-sync peer died, stalled past the timeout, or disagrees on the model layout."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (for :class:`SyncGroupConfig`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def choose_backend(trainer_device: torch.device | str, worker_device: torch.device | str) -> str:
    """``"nccl"`` when both ends hold their weights on *different* CUDA devices (AcceRL uses NCCL),
    ``"gloo"`` otherwise: on the CPU, across CPU and GPU, and for two processes on one GPU, which
    NCCL refuses to group."""
    a, b = torch.device(trainer_device), torch.device(worker_device)
    if a.type != "cuda" or b.type != "cuda":
        return "gloo"
    return "nccl" if (a.index or 0) != (b.index or 0) else "gloo"


@dataclass(frozen=True)
class SyncGroupConfig:
    """Where and how the two-rank sync group meets; picklable, so it is passed to the worker process.

    ``port`` is the group's own ``TCPStore`` port (hosted by the trainer, rank 0), distinct from any
    ``MASTER_PORT``. ``timeout_s`` bounds every collective (a dead or stalled peer raises after it);
    ``join_timeout_s`` bounds the rendezvous, which includes the peer process's start-up.
    """

    host: str = "127.0.0.1"
    port: int = 0
    backend: str = "gloo"
    timeout_s: float = 60.0
    join_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"SyncGroupConfig.backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"SyncGroupConfig.port must be in (0, 65536), got {self.port} (see free_port())")
        if self.timeout_s <= 0 or self.join_timeout_s <= 0:
            raise ValueError(f"SyncGroupConfig.timeout_s and join_timeout_s must be > 0, got "
                             f"{self.timeout_s} and {self.join_timeout_s}")

    @classmethod
    def local(cls, backend: str = "gloo", timeout_s: float = 60.0, join_timeout_s: float = 300.0
              ) -> SyncGroupConfig:
        """A config on 127.0.0.1 with a fresh free port."""
        return cls("127.0.0.1", free_port(), backend, timeout_s, join_timeout_s)

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)


def _device_identity(device: torch.device) -> str:
    host = socket.gethostname()
    if device.type != "cuda":
        return f"{host}/{device.type}"
    props = torch.cuda.get_device_properties(device)
    return f"{host}/cuda/{getattr(props, 'uuid', device.index)}"


def _gloo_options(cfg: SyncGroupConfig) -> Any:
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = cfg.timeout
    loopback = cfg.host in ("127.0.0.1", "localhost", "::1")
    device = dist.ProcessGroupGloo.create_device(hostname=cfg.host) if loopback else \
        dist.ProcessGroupGloo.create_default_device()
    opts._devices = [device]
    return opts


class _SyncGroup:
    """The two-rank group: own ``TCPStore`` + a directly constructed backend (no default group)."""

    def __init__(self, cfg: SyncGroupConfig, rank: int, name: str, device: torch.device) -> None:
        self.cfg, self.rank, self.name, self.device = cfg, rank, name, device
        self.peer = f"rank {1 - rank} (not yet joined)"
        self.broken: str | None = None
        try:
            join = datetime.timedelta(seconds=cfg.join_timeout_s)
            self.store = dist.TCPStore(cfg.host, cfg.port, 2, rank == TRAINER_RANK, timeout=join,
                                       wait_for_workers=False)
            self.store.set(f"{_PREFIX}/who/{rank}", f"{name} (pid {os.getpid()})")
            self.store.set(f"{_PREFIX}/device/{rank}", _device_identity(device))
            self.peer = f"{self.store.get(f'{_PREFIX}/who/{1 - rank}').decode()}, rank {1 - rank}"
            self._check_devices()
            pstore = dist.PrefixStore(f"{_PREFIX}/{cfg.backend}", self.store)
            self.pg = self._make_backend(pstore)
        except WeightSyncError:
            raise
        except Exception as exc:  # noqa: BLE001 -- rendezvous failures come as several types
            raise self._error("rendezvous", exc, cfg.join_timeout_s) from exc

    def _check_devices(self) -> None:
        if self.cfg.backend != "nccl":
            return
        if self.device.type != "cuda":
            raise WeightSyncError(f"weight sync backend 'nccl' needs CUDA weights; {self.name} has "
                                  f"{self.device}")
        mine = self.store.get(f"{_PREFIX}/device/{self.rank}").decode()
        theirs = self.store.get(f"{_PREFIX}/device/{1 - self.rank}").decode()
        if mine == theirs:
            raise WeightSyncError(
                f"{self.name} and {self.peer} are on the same GPU ({mine}): two processes on one GPU cannot "
                "form an NCCL group; use CUDA IPC (torch.multiprocessing shares CUDA tensors) instead")

    def _make_backend(self, pstore: Any) -> Any:
        if self.cfg.backend == "gloo":
            return dist.ProcessGroupGloo(pstore, self.rank, 2, _gloo_options(self.cfg))
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise WeightSyncError("backend 'nccl' requested but this torch build has no NCCL")
        torch.cuda.set_device(self.device)
        opts = nccl.Options()
        opts._timeout = self.cfg.timeout
        opts.is_high_priority_stream = False
        return nccl(pstore, self.rank, 2, opts)

    def _error(self, what: str, exc: BaseException, timeout_s: float | None = None) -> WeightSyncError:
        self.broken = f"{what}: {exc}"
        return WeightSyncError(
            f"weight sync {what} failed on {self.name}: peer {self.peer} via {self.cfg.backend} at "
            f"{self.cfg.host}:{self.cfg.port} died or did not answer within the "
            f"{timeout_s or self.cfg.timeout_s:g} s timeout ({type(exc).__name__}: {exc})")

    def guard(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (collectives / store calls); any failure becomes a :class:`WeightSyncError`."""
        if self.broken is not None:
            raise WeightSyncError(f"weight sync group of {self.name} is broken by an earlier error "
                                  f"({self.broken}); restart the peer {self.peer}")
        try:
            return fn()
        except WeightSyncError:
            raise
        except Exception as exc:  # noqa: BLE001 -- gloo/NCCL/store raise RuntimeError subclasses
            raise self._error(what, exc) from exc

    def bcast(self, tensor: torch.Tensor, src: int) -> Any:
        return self.pg.broadcast(tensor, src)

    def finish(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        pg = getattr(self, "pg", None)
        if pg is not None and hasattr(pg, "shutdown"):
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 -- best effort on teardown
                pass
        self.pg = None


def _tensors(module: nn.Module, layout: BucketLayout) -> list[torch.Tensor]:
    found = dict(module.named_parameters())
    found.update(module.named_buffers())
    out = []
    for slot in layout.slots:
        t = found.get(slot.name)
        if t is None or tuple(t.shape) != slot.shape or t.dtype != slot.dtype:
            got = None if t is None else (tuple(t.shape), t.dtype)
            raise WeightSyncError(f"weight sync: {slot.name} changed since the layout was planned: "
                                  f"expected {(slot.shape, slot.dtype)}, got {got}")
        out.append(t.detach())
    return out


class SyncEndpoint:
    """One end of the group: the module's fixed layout, its flat buckets and their views."""

    def __init__(self, module: nn.Module, config: SyncGroupConfig, rank: int, name: str,
                 bucket_mb: float, include_buffers: bool) -> None:
        self.module = module
        self.layout = plan_buckets(module, bucket_mb, include_buffers=include_buffers)
        device = _tensors(module, self.layout)[0].device
        self.group = _SyncGroup(config, rank, name, device)
        self.buckets = alloc_buckets(self.layout, device)
        self.views = bucket_views(self.layout, self.buckets)
        self.version = -1
        self._handshake()

    def _handshake(self) -> None:
        """Rank 0 sends its layout signature, rank 1 answers match/mismatch; both raise on mismatch."""
        g, lay = self.group, self.layout
        mine = torch.tensor([lay.signature, len(lay.buckets), lay.nbytes], dtype=torch.int64, device=g.device)
        theirs = mine.clone()
        g.guard("handshake", lambda: g.bcast(theirs, TRAINER_RANK).wait())
        ok = torch.tensor([int(torch.equal(mine, theirs))], dtype=torch.int64, device=g.device)
        g.guard("handshake", lambda: g.bcast(ok, WORKER_RANK).wait())
        if not int(ok.item()):
            raise WeightSyncError(f"weight sync layout mismatch between {g.name} and {g.peer}: "
                                  f"[signature, buckets, bytes] {mine.tolist()} vs {theirs.tolist()}")

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
    """Flat per-dtype buckets, one collective each; packing bucket b overlaps sending b-1."""

    name = "bucketed"

    def collectives(self, endpoint: SyncEndpoint) -> int:
        return len(endpoint.layout.buckets)

    def send(self, endpoint: SyncEndpoint, tensors: list[torch.Tensor]) -> None:
        works = []
        for b, bucket in enumerate(endpoint.layout.buckets):
            idx = list(bucket.slot_ids)
            torch._foreach_copy_([endpoint.views[i] for i in idx], [tensors[i] for i in idx])
            works.append(endpoint.group.bcast(endpoint.buckets[b], TRAINER_RANK))
        for w in works:
            w.wait()

    def recv(self, endpoint: SyncEndpoint, tensors: list[torch.Tensor]) -> None:
        works = [endpoint.group.bcast(buf, TRAINER_RANK) for buf in endpoint.buckets]
        for w, bucket in zip(works, endpoint.layout.buckets, strict=True):  # unpack b while b+1 arrives
            w.wait()
            idx = list(bucket.slot_ids)
            torch._foreach_copy_([tensors[i] for i in idx], [endpoint.views[i] for i in idx])


BUCKETED = BucketTransport()


class WeightBroadcaster(SyncEndpoint):
    """Trainer side (rank 0) of AcceRL's broadcast group; hosts the group's ``TCPStore``.

    Built from the trainer's module (the layout is fixed then); every call broadcasts the module's
    current values. ``latencies_ms`` keeps the last 4096 calls' latencies; ``last`` the latest
    :class:`SyncStats`; ``syncs`` counts completed calls.
    """

    def __init__(self, module: nn.Module, config: SyncGroupConfig, *, bucket_mb: float = 64.0,
                 include_buffers: bool = True, name: str = "trainer") -> None:
        super().__init__(module, config, TRAINER_RANK, name, bucket_mb, include_buffers)
        self.latencies_ms: deque[float] = deque(maxlen=4096)
        self.last: SyncStats | None = None
        self.syncs = 0
        self._announced = 0

    def signal_drain(self) -> None:
        """Inference Drain: tell the worker a sync is coming (idempotent until that sync runs)."""
        if self._announced <= self.syncs:
            g = self.group
            g.guard("drain signal", lambda: g.store.add(f"{_PREFIX}/announced", 1))
            self._announced = self.syncs + 1

    def broadcast(self, version: int, module: nn.Module | None = None, *,
                  transport: Transport = BUCKETED) -> SyncStats:
        """Send ``module``'s (default: the layout's module) current values as ``version`` through
        ``transport``; returns once the worker acked."""
        g, lay = self.group, self.layout
        t0 = time.perf_counter()
        self.signal_drain()
        tensors = _tensors(module if module is not None else self.module, lay)
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
        stats = SyncStats(version, transport.name, (time.perf_counter() - t0) * 1e3, lay.nbytes, n)
        self.latencies_ms.append(stats.latency_ms)
        self.syncs += 1
        self.last = stats
        return stats


class WeightReceiver(SyncEndpoint):
    """Inference-worker side (rank 1): receives into scratch buckets, then copies in place.

    ``receive`` writes into the live module's tensors with ``copy_`` (parameters keep their
    identity, so optimizers/compiled graphs holding them see the new values) and returns the version.
    """

    def __init__(self, module: nn.Module, config: SyncGroupConfig, *, bucket_mb: float = 64.0,
                 include_buffers: bool = True, name: str = "inference-worker") -> None:
        super().__init__(module, config, WORKER_RANK, name, bucket_mb, include_buffers)
        self.received = 0

    def sync_pending(self) -> bool:
        """True once the trainer announced a sync (drain signal) this worker has not received yet."""
        g = self.group
        return int(g.guard("drain poll", lambda: g.store.add(f"{_PREFIX}/announced", 0))) > self.received

    def receive(self, module: nn.Module | None = None, *, transport: Transport = BUCKETED) -> int:
        """Join the next broadcast (same ``transport`` as the trainer's); returns its version."""
        g, lay = self.group, self.layout
        tensors = _tensors(module if module is not None else self.module, lay)
        header = torch.zeros(4, dtype=torch.int64, device=g.device)
        g.guard("header broadcast", lambda: g.bcast(header, TRAINER_RANK).wait())
        version, n, signature, _ = (int(x) for x in header.tolist())
        expect = transport.collectives(self)
        if signature != lay.signature or n != expect:
            g.broken = "header mismatch"
            raise WeightSyncError(f"weight sync header from {g.peer} does not match {g.name}'s layout: "
                                  f"{header.tolist()} vs signature {lay.signature}, {expect} collectives")
        with torch.no_grad():
            g.guard(f"{transport.name} broadcast", lambda: transport.recv(self, tensors))
        g.finish()
        ack = torch.tensor([version], dtype=torch.int64, device=g.device)
        g.guard("ack", lambda: g.bcast(ack, WORKER_RANK).wait())
        self.version = version
        self.received += 1
        return version
