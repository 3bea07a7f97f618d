"""Batched inference worker: one process holds the policy and serves every sampler of a rank.

Large policies do not fit a copy per sampler (AcceRL §architecture), so samplers send observations
to this worker and get back actions, log-probs and values, tagged with the ``policy_version``.

**Transport.** Each sampler owns a fixed *slot* of shared-memory tensors sized for its envs, plus one
pipe that carries only tiny tuples (``("act", n_rows, progress)`` and the reply ``(version,
checksum)``): arrays are never pickled on the hot path. Pipes, because the worker can wait on all of
them at once (``multiprocessing.connection.wait``).

**Drain** (AcceRL §inference drain): the worker finishes the forward pass in flight and takes the
announced weights before the next, so no forward runs on a half-written model.
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from fastlight.inference.settings import InferenceSettings
from fastlight.procs import Liveness, start_child
from fastlight.weights.broadcast import SyncGroupConfig, WeightReceiver
from fastlight.weights.checksum import delivery_checksum
from fastlight.weights.double_buffer import SharedDoubleBuffer

ObsSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]


def rows_of(obs: Tensor | dict[str, Tensor]) -> int:
    """The batch size ``N`` of observations ``[N, ...]`` (a tensor, or a dict of them)."""
    return next(iter(obs.values())).shape[0] if isinstance(obs, dict) else obs.shape[0]


def by_key(obs: Tensor | dict[str, Tensor]) -> dict[str, Tensor]:
    """Observations as a dict (a tensor is stored under the key ``""``)."""
    return obs if isinstance(obs, dict) else {"": obs}


@dataclass
class Slot:
    """One sampler's shared-memory request/response buffers (``rows`` = its env count)."""

    obs: dict[str, Tensor]
    step: Tensor
    actions: Tensor
    logprobs: Tensor
    values: Tensor

    @staticmethod
    def allocate(rows: int, obs_spec: ObsSpec, act_spec: ObsSpec) -> Slot:
        def shm(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
            return torch.zeros((rows, *shape), dtype=dtype).share_memory_()

        return Slot(
            obs={k: shm(s, d) for k, (s, d) in obs_spec.items()},
            step=shm((), torch.long),
            actions=shm(*act_spec["actions"]),
            logprobs=shm(*act_spec["logprobs"]),
            values=shm((), torch.float32),
        )


def tensor_spec(batch: Tensor | dict[str, Tensor]) -> ObsSpec:
    """Per-row shape and dtype of a batch (a tensor is stored under the key ``""``)."""
    return {k: (tuple(v.shape[1:]), v.dtype) for k, v in by_key(batch).items()}


#: What a forward pass answers a request: its rows of ``(actions, logprobs, values)`` on the CPU
#: (``(None, None, values)`` for ``value``).
Answer = tuple[Tensor | None, Tensor | None, Tensor]


class BatchingServer(ABC):
    """The batching core of every inference worker (the local process below, the Ray actor): requests
    (a ``kind``, ``act`` or ``value``; ``rows``; their sampler's ``progress`` this round) wait in
    ``pending``; :meth:`serve` runs one forward pass per kind and answers each request with its rows,
    the weights' ``version`` and ``checksum``. A worker implements its transport: :meth:`poll`,
    :meth:`inputs`, :meth:`answer`."""

    def __init__(
        self, policy: nn.Module, *, max_batch: int, max_wait_ms: float, device: torch.device
    ) -> None:
        self.device = device
        self.policy = policy.to(device).eval()
        self.max_batch, self.max_wait_s = max_batch, max_wait_ms / 1000.0
        self.version = -1
        self.checksum = math.nan  # delivery_checksum of the weights taken as ``version``, sent with answers
        self.pending: list[Any] = []

    @abstractmethod
    def poll(self, timeout: float) -> None:
        """Move every request that is waiting (or arrives within ``timeout``) into ``pending``."""

    @abstractmethod
    def inputs(self, request: Any) -> tuple[dict[str, Tensor], Tensor]:
        """The request's observation rows (:func:`by_key`) and their steps ``[rows]``."""

    @abstractmethod
    def answer(self, request: Any, parts: Answer) -> None:
        """Hand ``parts`` (the request's rows), ``version`` and ``checksum`` back to its sampler."""

    def gather(self) -> list[Any]:
        """Dynamic batching: wait up to ``max_wait_ms`` for ``max_batch`` rows; then the next forward
        pass's requests, stragglers (least progress this round) first, up to ``max_batch`` rows (at
        least one request), taken out of ``pending``, which is left sorted."""
        deadline = time.monotonic() + self.max_wait_s
        while sum(r.rows for r in self.pending) < self.max_batch and time.monotonic() < deadline:
            self.poll(max(0.0, deadline - time.monotonic()))
        self.pending.sort(key=lambda r: r.progress)
        batch, rows = [], 0
        for r in list(self.pending):
            if batch and rows + r.rows > self.max_batch:
                break
            batch.append(r)
            rows += r.rows
            self.pending.remove(r)
        return batch

    @torch.no_grad()
    def serve(self, batch: list[Any]) -> None:
        """One forward pass per kind of request in ``batch`` (acts and value queries apart)."""
        for kind in ("act", "value"):
            if not (reqs := [r for r in batch if r.kind == kind]):
                continue
            inputs = [self.inputs(r) for r in reqs]
            obs = {k: torch.cat([o[k] for o, _ in inputs]).to(self.device) for k in inputs[0][0]}
            x = obs[""] if set(obs) == {""} else obs
            step = torch.cat([s for _, s in inputs]).to(self.device)
            if kind == "act":
                out = self.policy.act(x, step=step)
                parts: Answer = (out.actions.cpu(), out.logprobs.cpu(), out.values.float().cpu())
            else:
                parts = (None, None, self.policy.value(x, step=step).float().cpu())
            offset = 0
            for r in reqs:
                sl = slice(offset, offset + r.rows)
                self.answer(r, tuple(None if p is None else p[sl] for p in parts))  # type: ignore[arg-type]
                offset += r.rows

    def serve_once(self) -> None:
        """Serve one batch if a request waits (a short poll otherwise); before the first sync the
        requests wait for weights."""
        if not self.pending:
            self.poll(0.005)
        if self.pending and self.version >= 0:
            self.serve(self.gather())

    def on_sync(self, version: int) -> None:
        """New weights are in place as ``version``: their checksum, for the trainer's delivery check."""
        self.checksum = delivery_checksum(self.policy).value
        self.version = version


@dataclass
class SlotRequest:
    index: int  # sampler index
    kind: str
    rows: int
    progress: int


class InferenceServer(BatchingServer):
    """The local worker's transport over the samplers' slots and pipes (runs in its own process)."""

    def __init__(self, policy: nn.Module, slots: list[Slot], conns: list[Connection], *, max_batch: int,
                 max_wait_ms: float, device: torch.device) -> None:  # fmt: skip
        super().__init__(policy, max_batch=max_batch, max_wait_ms=max_wait_ms, device=device)
        self.slots, self.conns = slots, conns

    def poll(self, timeout: float) -> None:
        for conn in wait(self.conns, timeout=timeout):
            try:
                kind, rows, progress = conn.recv()
            except EOFError:  # the sampler died: the trainer's pool names it and restarts the group
                raise SystemExit(1) from None
            self.pending.append(SlotRequest(self.conns.index(conn), kind, rows, progress))

    def inputs(self, request: SlotRequest) -> tuple[dict[str, Tensor], Tensor]:
        s, n = self.slots[request.index], request.rows
        return {k: v[:n] for k, v in s.obs.items()}, s.step[:n]

    def answer(self, request: SlotRequest, parts: Answer) -> None:
        s, n = self.slots[request.index], request.rows
        actions, logprobs, values = parts
        if actions is not None and logprobs is not None:
            s.actions[:n].copy_(actions)
            s.logprobs[:n].copy_(logprobs)
        s.values[:n].copy_(values)
        self.conns[request.index].send((self.version, self.checksum))

    def fail_all(self, message: str) -> None:
        for conn in self.conns:
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send(("error", message))


class SyncReceiver(Protocol):
    """The worker's end of a weight path: :class:`~fastlight.weights.broadcast.WeightReceiver`
    (broadcast) or :class:`~fastlight.weights.double_buffer.DoubleBufferReader` (shared memory)."""

    def sync_pending(self) -> bool: ...

    def receive(self, module: nn.Module) -> int: ...


def serve_until(
    receiver: SyncReceiver,
    policy: nn.Module,
    *,
    stopped: Callable[[], bool],
    serve_once: Callable[[], None],
    on_sync: Callable[[int], None],
) -> None:
    """The inference worker's loop (AcceRL §inference drain): between two forward passes, take the
    announced weights (``on_sync(version)`` once in place), else ``serve_once()``; until ``stopped()``."""
    while not stopped():
        if receiver.sync_pending():
            on_sync(receiver.receive(policy))
            continue
        serve_once()


def inference_main(
    policy: nn.Module,
    slots: list[Slot],
    conns: list[Connection],
    sync: SyncGroupConfig | SharedDoubleBuffer,
    version: Any,
    stop: Any,
    settings: InferenceSettings,
    parent_pid: int,
    device: str,
    liveness: Liveness,
) -> None:
    """Entry point of the inference worker process, serving until ``stop``. ``sync``: the broadcast
    group's config, or the shared double buffer. ``liveness`` beats at every turn of the loop and of
    a wait for weights."""
    start_child(parent_pid, threads=settings.threads)
    server = InferenceServer(policy, slots, conns, max_batch=settings.max_batch,
                             max_wait_ms=settings.max_wait_ms, device=torch.device(device))  # fmt: skip

    def stopped() -> bool:  # polled by every loop and wait of this worker: the heartbeat's place
        liveness.beat()
        return stop.is_set()

    def on_sync(new: int) -> None:
        server.on_sync(new)
        version.value = new

    try:
        name = "inference worker"
        receiver: SyncReceiver
        if isinstance(sync, SharedDoubleBuffer):
            receiver = sync.attach(server.policy, name=name, stopped=stopped)
        else:
            receiver = WeightReceiver(server.policy, sync, bucket_mb=settings.sync_bucket_mb, name=name)
        serve_until(receiver, server.policy, stopped=stopped, serve_once=server.serve_once, on_sync=on_sync)
    except Exception:
        server.fail_all(traceback.format_exc())
        raise
