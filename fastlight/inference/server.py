"""Batched inference worker: one process holds the policy and serves every sampler of a rank.

Large policies do not fit a copy per sampler (AcceRL §architecture), so samplers send
observations to this worker and get back actions, log-probs and values, each tagged with the
``policy_version`` that produced them.

**Transport.** Each sampler owns a fixed *slot* of shared-memory tensors (observation rows in,
actions / log-probs / values out) sized for its envs, plus one ``multiprocessing`` pipe that
carries only tiny tuples (``("act", n_rows, progress)`` and the reply ``(version, checksum)``: the
weights' :func:`~fastlight.weights.checksum.delivery_checksum`, taken at each sync). Arrays are
never pickled on the hot path: the worker gathers the rows straight from the slots, runs one
forward pass, and scatters the results back. Pipes (not queues) because the worker can wait
on all of them at once with ``multiprocessing.connection.wait`` and a reply goes to exactly
one sampler.

**Dynamic batching.** After the first request the worker waits up to ``max_wait_ms`` for more,
stopping early at ``max_batch`` rows. Stragglers are served first: requests are ordered by the
sampler's progress (env steps taken in its current round), smallest first.

**Drain** (AcceRL §inference drain). When the trainer raises ``drain``, the worker finishes the
forward pass in flight, schedules no new one and takes the new weights; after that they are live
and serving resumes. How they arrive depends on the worker's device: a CPU worker on the
trainer's host swaps its parameters to the trainer's newly written shared-memory buffer
(:mod:`fastlight.weights.double_buffer`, a pointer swap); a CUDA worker on the trainer's GPU
does the same with the buffer's slots on that GPU (CUDA IPC); a CUDA worker on another GPU joins
the weight broadcast (:mod:`fastlight.weights.broadcast`). Either way the swap happens only between two
forward passes, so no forward ever runs on a half-written model.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from fastlight.procs import Liveness, start_child
from fastlight.weights.broadcast import SyncGroupConfig, WeightReceiver
from fastlight.weights.checksum import delivery_checksum
from fastlight.weights.double_buffer import SharedDoubleBuffer

ObsSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]


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
    items = batch.items() if isinstance(batch, dict) else [("", batch)]
    return {k: (tuple(v.shape[1:]), v.dtype) for k, v in items}


@dataclass
class Request:
    index: int  # sampler index
    kind: str
    rows: int
    progress: int


def pick_batch(pending: list[Any], max_batch: int) -> list[Any]:
    """The next forward pass's requests (anything with ``rows`` and ``progress``): stragglers first
    (least progress this round), up to ``max_batch`` rows (at least one request); taken out of
    ``pending``, which is left sorted."""
    pending.sort(key=lambda r: r.progress)
    batch, rows = [], 0
    for r in list(pending):
        if batch and rows + r.rows > max_batch:
            break
        batch.append(r)
        rows += r.rows
        pending.remove(r)
    return batch


def forward(policy: nn.Module, kind: str, obs: Tensor | dict[str, Tensor], step: Tensor) -> tuple:
    """One batched forward pass, its results on the CPU: ``(actions, logprobs, values)`` for ``act``,
    ``(None, None, values)`` for ``value``."""
    if kind == "act":
        out = policy.act(obs, step=step)
        return out.actions.cpu(), out.logprobs.cpu(), out.values.float().cpu()
    return None, None, policy.value(obs, step=step).float().cpu()


class InferenceServer:
    """The worker's serving loop over the samplers' slots and pipes (runs in its own process)."""

    def __init__(
        self,
        policy: nn.Module,
        slots: list[Slot],
        conns: list[Connection],
        *,
        max_batch: int,
        max_wait_ms: float,
        device: torch.device,
    ) -> None:
        self.policy = policy.to(device).eval()
        self.slots, self.conns = slots, conns
        self.max_batch, self.max_wait_s = max_batch, max_wait_ms / 1000.0
        self.device = device
        self.version = -1
        self.checksum = math.nan  # delivery_checksum of the weights taken as ``version``, sent with answers
        self.pending: list[Request] = []
        self.forwards = 0

    def poll(self, timeout: float) -> None:
        """Receive every request that is waiting (or arrives within ``timeout``)."""
        for conn in wait(self.conns, timeout=timeout):
            i = self.conns.index(conn)
            kind, rows, progress = conn.recv()
            self.pending.append(Request(i, kind, rows, progress))

    def gather(self) -> list[Request]:
        """Dynamic batching: wait up to ``max_wait_ms`` for ``max_batch`` rows; stragglers first."""
        deadline = time.monotonic() + self.max_wait_s
        while sum(r.rows for r in self.pending) < self.max_batch and time.monotonic() < deadline:
            self.poll(max(0.0, deadline - time.monotonic()))
        return pick_batch(self.pending, self.max_batch)

    @torch.no_grad()
    def serve(self, batch: list[Request]) -> None:
        """One forward pass for a batch of requests (acts and value queries apart)."""
        for kind in ("act", "value"):
            reqs = [r for r in batch if r.kind == kind]
            if not reqs:
                continue
            obs = {
                k: torch.cat([self.slots[r.index].obs[k][: r.rows] for r in reqs]).to(self.device)
                for k in self.slots[reqs[0].index].obs
            }
            step = torch.cat([self.slots[r.index].step[: r.rows] for r in reqs]).to(self.device)
            parts = forward(self.policy, kind, obs[""] if set(obs) == {""} else obs, step)
            self.forwards += 1
            offset = 0
            for r in reqs:
                s = self.slots[r.index]
                sl = slice(offset, offset + r.rows)
                if parts[0] is not None:
                    s.actions[: r.rows].copy_(parts[0][sl])
                    s.logprobs[: r.rows].copy_(parts[1][sl])
                s.values[: r.rows].copy_(parts[2][sl])
                offset += r.rows
        for r in batch:
            self.conns[r.index].send((self.version, self.checksum))

    def fail_all(self, message: str) -> None:
        for conn in self.conns:
            try:
                conn.send(("error", message))
            except (BrokenPipeError, OSError):
                pass


class SyncReceiver(Protocol):
    """The worker's end of a weight path: :class:`~fastlight.weights.broadcast.WeightReceiver`
    (broadcast) or :class:`~fastlight.weights.double_buffer.DoubleBufferReader` (shared memory)."""

    def sync_pending(self) -> bool: ...

    def receive(self, module: nn.Module) -> int: ...


def make_receiver(
    policy: nn.Module,
    sync: SyncGroupConfig | SharedDoubleBuffer,
    *,
    bucket_mb: float,
    stopped: Callable[[], bool],
    name: str = "inference worker",
) -> Any:
    """The worker end matching the trainer's choice: a shared double buffer or a broadcast group."""
    if isinstance(sync, SharedDoubleBuffer):
        return sync.attach(policy, name=name, stopped=stopped)
    return WeightReceiver(policy, sync, bucket_mb=bucket_mb, name=name)


def serve_until(
    receiver: SyncReceiver,
    policy: nn.Module,
    *,
    stopped: Callable[[], bool],
    serve_once: Callable[[], None],
    on_sync: Callable[[int], None],
) -> None:
    """The inference worker's loop (AcceRL §inference drain): between two forward passes, if the
    trainer announced a sync, start no new forward and take the new weights (``on_sync(version)``
    once they are in place: broadcast received, or shared-memory slot swapped in); otherwise
    ``serve_once()``. Until ``stopped()``.

    Shared by the worker below and the benchmark's emulated worker (``benchmarks.sync.worker``).
    """
    while not stopped():
        if receiver.sync_pending():
            on_sync(receiver.receive(policy))
            continue
        serve_once()


def inference_main(
    policy: nn.Module,
    slots: list[Slot],
    conns: list[Connection],
    sync_config: SyncGroupConfig | SharedDoubleBuffer,
    version: Any,
    stop: Any,
    max_batch: int,
    max_wait_ms: float,
    bucket_mb: float,
    parent_pid: int,
    device: str = "cpu",
    liveness: Liveness | None = None,
    threads: int | None = None,
) -> None:
    """Entry point of the inference worker process (spawned); ``threads``: its torch threads
    (``None``: torch's default).

    Serves batches until ``stop``; between two forward passes it checks the trainer's drain
    signal and, when set, takes the new weights (nothing is in flight at that point):
    ``sync_config`` is the broadcast group's config, or the shared double buffer (CPU worker).
    ``liveness`` (its heartbeat) beats at every turn of the loop and of a wait for weights:
    the trainer's pool restarts a worker whose counter stands still for ``--data.faults.heartbeat_s``.
    """
    start_child(parent_pid, threads=threads)
    server = InferenceServer(
        policy, slots, conns, max_batch=max_batch, max_wait_ms=max_wait_ms, device=torch.device(device)
    )

    def stopped() -> bool:  # polled by every loop and wait of this worker: the heartbeat's place
        if liveness is not None:
            liveness.beat()
        return stop.is_set()

    try:
        receiver = make_receiver(server.policy, sync_config, bucket_mb=bucket_mb, stopped=stopped)

        def serve_once() -> None:
            if not server.pending:
                server.poll(0.005)
            if server.pending and server.version >= 0:
                server.serve(server.gather())

        def on_sync(new: int) -> None:
            # What arrived, for the trainer's delivery check (one host sync per publish, none per forward).
            server.checksum = delivery_checksum(server.policy).value
            server.version = version.value = new

        serve_until(receiver, server.policy, stopped=stopped, serve_once=serve_once, on_sync=on_sync)
    except Exception:
        server.fail_all(traceback.format_exc())
        raise
