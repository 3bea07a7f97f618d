"""The inference worker as a Ray actor: one per trainer rank, on any node, serving that rank's Ray samplers.

With ``--data.fleet RayFleet`` and ``--data.inference`` set, a rank's policy is held by one
:class:`InferenceActor` instead of a copy in every sampler actor (AcceRL §architecture). The samplers
act through :class:`RayServedPolicy` (calls on the actor), which the actor batches as the local worker
does (:class:`~fastlight.inference.server.BatchingServer`). Weights arrive over a two-rank
``torch.distributed`` group (:mod:`fastlight.weights.broadcast`), drained as locally (AcceRL
§inference drain).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fastlight.inference.remote import ServedProxy
from fastlight.inference.server import Answer, BatchingServer, by_key, rows_of, serve_until
from fastlight.models.base import ActionMapping
from fastlight.weights.broadcast import SyncGroupConfig, WeightReceiver

#: How long a sampler's call waits on the actor before it looks at the actor's own error again.
POLL_S = 1.0


@dataclass
class _Call:
    """One sampler's request: ``kind`` ``act`` or ``value``, its rows, the sampler's progress this round."""

    kind: str
    obs: Tensor | dict[str, Tensor]
    step: Tensor
    progress: int
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None

    @property
    def rows(self) -> int:
        return rows_of(self.obs)


def where_it_runs() -> tuple[str, str, int]:
    """Where the calling Ray actor runs: (node id, node IP, pid)."""
    import ray

    ctx = ray.get_runtime_context()
    return ctx.get_node_id(), ray.util.get_node_ip_address(), os.getpid()


class InferenceActor(BatchingServer):
    """The actor's class (wrapped by ``ray.remote`` in the fleet; importable without Ray). A threaded
    actor: every sampler's call waits in its own thread, one serving thread runs the forward passes and
    the weight syncs."""

    def __init__(self, policy: nn.Module, sync: SyncGroupConfig, *, device: str, max_batch: int,
                 max_wait_ms: float, bucket_mb: float) -> None:  # fmt: skip
        if torch.device(device).type == "cpu":
            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        super().__init__(policy, max_batch=max_batch, max_wait_ms=max_wait_ms, device=torch.device(device))
        self.calls: queue.Queue[_Call] = queue.Queue()
        self.error: str | None = None
        self._stop = threading.Event()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(sync, bucket_mb), daemon=True,
                                        name="fastlight-inference")  # fmt: skip
        self._thread.start()

    # ------------------------------------------------------------ the serving thread
    def _run(self, sync: SyncGroupConfig, bucket_mb: float) -> None:
        receiver = None
        try:
            # Joins the trainer's group (it hosts the store; it creates its end at its first publish).
            receiver = WeightReceiver(self.policy, sync, bucket_mb=bucket_mb, name="Ray inference worker")
            serve_until(receiver, self.policy, stopped=self._stop.is_set, serve_once=self.serve_once,
                        on_sync=self.on_sync)  # fmt: skip
        except BaseException:  # noqa: BLE001 -- reported to every caller and to the trainer
            self.error = traceback.format_exc()
        finally:
            if receiver is not None:
                receiver.close()
            self._fail_pending()
            self._ended.set()

    def poll(self, timeout: float) -> None:
        with contextlib.suppress(queue.Empty):
            self.pending.append(self.calls.get(timeout=timeout))
            while True:
                self.pending.append(self.calls.get_nowait())

    def inputs(self, request: _Call) -> tuple[dict[str, Tensor], Tensor]:
        return by_key(request.obs), request.step

    def answer(self, request: _Call, parts: Answer) -> None:
        request.result = (*(None if p is None else p.clone() for p in parts), self.version, self.checksum)
        request.done.set()

    def _fail_pending(self) -> None:
        self.poll(0.0)
        for c in self.pending:
            c.result = ("error", self.error or "the Ray inference worker stopped")
            c.done.set()
        self.pending = []

    # ------------------------------------------------------------ called by the samplers
    def serve_call(self, kind: str, obs: Tensor | dict[str, Tensor], step: Tensor, progress: int) -> tuple:
        """``(actions, logprobs, values, version, checksum)`` (actions and logprobs ``None`` for
        ``value``), or ``("error", traceback)`` once the serving thread failed."""
        if self._ended.is_set():
            return ("error", self.error or "the Ray inference worker stopped")
        call = _Call(kind, obs, step, progress)
        self.calls.put(call)
        while not call.done.wait(POLL_S):
            if self._ended.is_set():
                self._fail_pending()
        return call.result

    def weights_version(self) -> int:
        return self.version

    # ------------------------------------------------------------ called by the trainer
    def wait_ended(self) -> str | None:
        """Blocks until the serving thread ends; its error (a traceback), or None after :meth:`stop`."""
        self._ended.wait()
        return self.error

    def info(self) -> tuple[str, str, int]:
        """Where it runs: (node id, node IP, pid)."""
        return where_it_runs()

    def stop(self) -> None:
        self._stop.set()


class RayServedPolicy(ServedProxy):
    """A Ray sampler's policy when an :class:`InferenceActor` serves it: each ``act`` / ``value`` is
    one call on the actor."""

    def __init__(self, actor: Any, action_mapping: ActionMapping) -> None:
        super().__init__(action_mapping)
        self.actor = actor

    worker = "Ray inference worker"

    def _serve(self, kind: str, obs: Tensor | dict[str, Tensor], step: Tensor) -> tuple:
        import ray

        return ray.get(self.actor.serve_call.remote(kind, obs, step, self.progress))


class RayServedVersion:
    """A Ray sampler's weight source with an inference actor: the actor's version; nothing to load."""

    #: A sampler waiting for new weights polls ``version`` every 2 ms: ask the actor at most this often.
    EVERY_S = 0.02

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._version, self._asked = -1, 0.0

    @property
    def version(self) -> int:
        import ray

        if time.monotonic() - self._asked >= self.EVERY_S:
            self._version = int(ray.get(self.actor.weights_version.remote()))
            self._asked = time.monotonic()
        return self._version

    def load_into(self, policy: nn.Module) -> int:
        return self.version
