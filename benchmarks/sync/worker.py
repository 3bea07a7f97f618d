"""The inference-worker process of ``python -m benchmarks.sync`` (AcceRL §weight sync, §drain).

It holds a copy of the benchmark model (a stack of ``nn.Linear``) and obeys small commands from
the trainer over a pipe, acking each once the new weights are *loaded in place*:

- ``("bucketed" | "per_tensor", version)``: join the broadcast (:class:`WeightReceiver`);
- ``("pickle", version)``: take ``bytes`` off a ``multiprocessing`` queue, ``pickle.loads`` them
  into a state dict, ``load_state_dict`` (host-staged transfer with serialization);
- ``("checkpoint", version, path)``: ``torch.load`` the file the trainer wrote,
  ``load_state_dict`` (shared-storage checkpoint reload, as in AReaL);
- ``("shared_memory", version)``: swap to the trainer's newly written shared-memory slot
  (:class:`~fastlight.weights.double_buffer.DoubleBufferReader`: pointers, not bytes);
- ``("checksum",)``: reply with :func:`~benchmarks.checksums.weights_checksum` (copies match?);
- ``("serve", forward_ms, batch)``: serve a steady load until ``("stop",)``: one forward batch
  after another, each ``forward_ms`` long (a real forward through the model, then a sleep for the
  rest of the batch's emulated accelerator time). Between batches it checks the drain signal
  (:meth:`WeightReceiver.sync_pending`) and, if set, starts no new batch and joins the broadcast.
"""

from __future__ import annotations

import pickle
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch
from torch import nn

from benchmarks.checksums import weights_checksum
from benchmarks.sync.per_tensor import PER_TENSOR
from fastlight.inference.server import serve_until
from fastlight.weights.broadcast import SyncGroupConfig, WeightReceiver
from fastlight.weights.double_buffer import DoubleBufferReader, SharedDoubleBuffer

_SUFFIX = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}


def parse_size(text: str) -> tuple[int, int | None]:
    """``"10M"`` -> (10_000_000, None); ``"10M:128"`` -> (10_000_000, 128): the same parameter
    count in ``nn.Linear(128, 128)`` layers, i.e. many small tensors."""
    count, _, width = text.strip().upper().partition(":")
    n = int(float(count[:-1]) * _SUFFIX[count[-1]]) if count and count[-1] in _SUFFIX else int(count)
    return n, (int(width) if width else None)


def model_shape(n_params: int, width: int | None = None) -> tuple[int, int]:
    """``(width, layers)`` of a square ``nn.Linear`` stack with about ``n_params`` parameters."""
    if width is None:
        width = next((w for w, limit in ((512, 5e6), (1024, 3e7), (2048, 3e8)) if n_params < limit), 4096)
    return width, max(1, round(n_params / (width * width + width)))


def make_model(n_params: int, dtype: torch.dtype, device: torch.device | str, seed: int,
               width: int | None = None) -> nn.Sequential:
    width, layers = model_shape(n_params, width)
    torch.manual_seed(seed)
    with torch.device(device):
        model = nn.Sequential(*[nn.Linear(width, width, dtype=dtype) for _ in range(layers)])
    return model  # trainable, like a policy's weights: a weight sync publishes trainable tensors only


@dataclass(frozen=True)
class WorkerSpec:
    """Everything the spawned worker needs (picklable)."""

    n_params: int
    width: int | None
    dtype: str
    device: str
    seed: int
    bucket_mb: float
    group: SyncGroupConfig


def _serve(model: nn.Module, rx: WeightReceiver, conn: Connection, forward_ms: float, batch: int) -> dict:
    width = model[0].in_features
    x = torch.randn(batch, width, dtype=model[0].weight.dtype, device=model[0].weight.device)
    counts = {"forwards": 0, "syncs": 0}

    def stopped() -> bool:
        if not conn.poll():
            return False
        msg = conn.recv()
        if msg[0] != "stop":
            raise RuntimeError(f"serve loop got {msg[0]!r}, expected 'stop'")
        return True

    def on_sync(version: int) -> None:
        counts["syncs"] += 1

    def forward() -> None:  # one emulated batch: a real forward, then sleep out its accelerator time
        t0 = time.perf_counter()
        with torch.no_grad():
            model(x)
        if x.is_cuda:
            torch.cuda.synchronize(x.device)
        rest = forward_ms / 1e3 - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)
        counts["forwards"] += 1

    # The production worker's loop: drain between batches, then join the broadcast.
    serve_until(rx, model, stopped=stopped, serve_once=forward, on_sync=on_sync)
    return {**counts, "version": rx.version}


def _handle(msg: tuple, model: nn.Module, rx: WeightReceiver, conn: Connection, queue: Any,
            reader: DoubleBufferReader | None) -> Any:
    kind = msg[0]
    if kind == "shared_memory":
        if reader is None:
            raise ValueError("shared_memory: the trainer passed no shared double buffer")
        return reader.receive(model)
    if kind == "bucketed":
        return rx.receive(model)
    if kind == "per_tensor":
        return rx.receive(model, transport=PER_TENSOR)
    if kind == "pickle":
        state = pickle.loads(queue.get())
        model.load_state_dict(state)
        return msg[1]
    if kind == "checkpoint":
        state = torch.load(msg[2], map_location=next(model.parameters()).device, weights_only=True)
        model.load_state_dict(state)
        return msg[1]
    if kind == "checksum":
        return weights_checksum(model)
    if kind == "serve":
        return _serve(model, rx, conn, msg[1], msg[2])
    raise ValueError(f"unknown command {kind!r}")


def worker_main(spec: WorkerSpec, conn: Connection, queue: Any,
                shared: SharedDoubleBuffer | None = None) -> None:
    """Spawned entry point: replies ``("ok", value)`` per command, or ``("error", traceback)``."""
    torch.set_num_threads(1)
    try:
        model = make_model(spec.n_params, getattr(torch, spec.dtype), spec.device, spec.seed, spec.width)
        rx = WeightReceiver(model, spec.group, bucket_mb=spec.bucket_mb, name="bench inference worker")
        reader = None if shared is None else shared.attach(model, name="bench inference worker")
        conn.send(("ok", "ready"))
        while True:
            msg = conn.recv()
            if msg[0] == "quit":
                rx.close()
                return
            value = _handle(msg, model, rx, conn, queue, reader)
            if spec.device.startswith("cuda"):
                torch.cuda.synchronize()
            conn.send(("ok", value))
    except Exception:  # noqa: BLE001 -- the trainer re-raises it with the traceback
        conn.send(("error", traceback.format_exc()))
