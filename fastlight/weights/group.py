"""The two-rank group a weight broadcast runs over: its own ``TCPStore``, a directly built backend.

The backend object is built directly (``ProcessGroupGloo`` / ``ProcessGroupNCCL`` over a
``PrefixStore``), so it neither needs nor touches Lightning's default group. A peer that dies or
stalls makes the waiting side raise :class:`WeightSyncError` (:meth:`SyncGroup.guard`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from fastlight.weights.publisher import WeightSyncError

TRAINER_RANK, WORKER_RANK = 0, 1
_PREFIX = "fastlight/weight_sync"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (for :class:`SyncGroupConfig`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def choose_backend(trainer_device: torch.device | str, worker_device: torch.device | str) -> str:
    """``"nccl"`` when both ends hold their weights on *different* CUDA devices (AcceRL uses NCCL),
    ``"gloo"`` otherwise (NCCL refuses to group two processes on one GPU)."""
    a, b = torch.device(trainer_device), torch.device(worker_device)
    return "nccl" if a.type == b.type == "cuda" and (a.index or 0) != (b.index or 0) else "gloo"


@dataclass(frozen=True)
class SyncGroupConfig:
    """Where and how the two-rank sync group meets (picklable). ``port``: the group's own ``TCPStore``
    (hosted by the trainer, rank 0); ``timeout_s`` bounds every collective; ``join_timeout_s`` the
    rendezvous, the peer process's start-up included."""

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
            raise ValueError(
                f"SyncGroupConfig.timeout_s and join_timeout_s must be > 0, got "
                f"{self.timeout_s} and {self.join_timeout_s}"
            )

    @classmethod
    def local(
        cls, backend: str = "gloo", timeout_s: float = 60.0, join_timeout_s: float = 300.0
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
    gloo = dist.ProcessGroupGloo
    loopback = cfg.host in ("127.0.0.1", "localhost", "::1")
    opts._devices = [gloo.create_device(hostname=cfg.host) if loopback else gloo.create_default_device()]
    return opts


class SyncGroup:
    """The two-rank group: own ``TCPStore`` + a directly constructed backend (no default group)."""

    def __init__(self, cfg: SyncGroupConfig, rank: int, name: str, device: torch.device) -> None:
        self.cfg, self.rank, self.name, self.device = cfg, rank, name, device
        self.pg: Any = None
        self.peer = f"rank {1 - rank} (not yet joined)"
        self.broken: str | None = None
        try:
            join = datetime.timedelta(seconds=cfg.join_timeout_s)
            is_host = rank == TRAINER_RANK
            self.store = dist.TCPStore(cfg.host, cfg.port, 2, is_host, timeout=join, wait_for_workers=False)
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
            raise WeightSyncError(
                f"weight sync backend 'nccl' needs CUDA weights; {self.name} has {self.device}"
            )
        mine = self.store.get(f"{_PREFIX}/device/{self.rank}").decode()
        theirs = self.store.get(f"{_PREFIX}/device/{1 - self.rank}").decode()
        if mine == theirs:
            raise WeightSyncError(
                f"{self.name} and {self.peer} are on the same GPU ({mine}): two processes on one GPU cannot "
                "form an NCCL group; use the CUDA IPC double buffer instead (SharedDoubleBuffer(device=...), "
                "what fastlight.inference.client.weight_path picks for one GPU: 'cuda_ipc')"
            )

    def _make_backend(self, pstore: Any) -> Any:
        if self.cfg.backend == "gloo":
            return dist.ProcessGroupGloo(pstore, self.rank, 2, _gloo_options(self.cfg))
        if (nccl := getattr(dist, "ProcessGroupNCCL", None)) is None:
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
            f"{timeout_s or self.cfg.timeout_s:g} s timeout ({type(exc).__name__}: {exc})"
        )

    def guard(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (collectives / store calls); any failure becomes a :class:`WeightSyncError`."""
        if self.broken is not None:
            raise WeightSyncError(
                f"weight sync group of {self.name} is broken by an earlier error "
                f"({self.broken}); restart the peer {self.peer}"
            )
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
        if self.pg is not None and hasattr(self.pg, "shutdown"):  # older torch builds have no shutdown()
            with contextlib.suppress(Exception):  # best effort on teardown
                self.pg.shutdown()
        self.pg = None
