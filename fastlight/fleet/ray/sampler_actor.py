"""The sampler actor of :class:`~fastlight.fleet.ray.fleet.RayFleet`: the sampler process's own loop
(:func:`~fastlight.sampling.worker.run_sampler`) in a Ray actor, its weights from the object store
(:class:`ActorWeights`; the trainer's end is :class:`StoreWeights`), its Rollouts taken by the trainer's
``next_rollout`` calls (a :class:`~fastlight.sampling.worker.Handoff`). Ray is imported only inside the
actor's methods.
"""

from __future__ import annotations

import queue
import threading
import warnings
from typing import Any

import torch
from torch import nn

from fastlight.fleet.ray.inference_actor import RayServedVersion, where_it_runs
from fastlight.procs import seed_everything
from fastlight.sampling.bundle import SamplerBundle, SamplerConfig
from fastlight.sampling.task_weights import SharedTaskWeights
from fastlight.sampling.worker import Handoff, run_sampler
from fastlight.weights.buckets import (
    ONE_BUCKET_PER_DTYPE_MB,
    BucketLayout,
    PackedWeights,
    layout_tensors,
    plan_buckets,
)
from fastlight.weights.publisher import WeightSource, WeightSyncError


class StoreWeights:
    """The trainer's end of the object-store path: the published tensors packed into flat per-dtype
    buckets, put as ``(signature, [bytes of each bucket])``: uint8 numpy arrays, which an actor reads
    without a copy, whatever the dtype (bfloat16 included)."""

    def __init__(self, policy: nn.Module) -> None:
        self.packed = PackedWeights.alloc(plan_buckets(policy, ONE_BUCKET_PER_DTYPE_MB))

    @property
    def nbytes(self) -> int:
        return self.packed.layout.nbytes

    def put(self, ray: Any, policy: nn.Module) -> Any:
        """``policy``'s current weights in the object store; returns the ref."""
        self.packed.pack(layout_tensors(policy, self.packed.layout))
        buckets = [b.view(torch.uint8).numpy() for b in self.packed.buckets]
        return ray.put((self.packed.layout.signature, buckets))  # copied into the store here


class ActorWeights:
    """A sampler actor's weight source: the newest version the trainer sent (its object ref, fetched
    only when a round starts on it), unpacked into the policy."""

    def __init__(self) -> None:
        self._layout: BucketLayout | None = None
        self._lock = threading.Lock()
        self._version = -1
        self._ref: Any = None

    def offer(self, version: int, ref: Any) -> None:
        with self._lock:  # calls may arrive out of order on a threaded actor: keep the newest
            if version > self._version:
                self._version, self._ref = version, ref

    @property
    def version(self) -> int:
        return self._version

    def load_into(self, policy: nn.Module) -> int:
        import ray

        with self._lock:
            version, ref = self._version, self._ref
        signature, arrays = ray.get(ref)
        if self._layout is None:  # planned from the actor's own copy, as the trainer planned from its
            self._layout = plan_buckets(policy, ONE_BUCKET_PER_DTYPE_MB)
        layout = self._layout
        if signature != layout.signature:
            raise WeightSyncError("RayFleet: the published tensors differ from the sampler's policy copy")
        with warnings.catch_warnings():  # object-store memory is read-only, and only read here
            warnings.simplefilter("ignore", UserWarning)
            buckets = [torch.from_numpy(a).view(b.dtype) for a, b in zip(arrays, layout.buckets, strict=True)]
        PackedWeights(layout, buckets).unpack(layout_tensors(policy, layout))
        return version


class SamplerActor:
    """One sampler inside a Ray actor, stepped by the sampler process's loop in a thread; the trainer
    calls the methods below (a threaded actor)."""

    def __init__(
        self,
        index: int,
        cfg: SamplerConfig,
        policy: nn.Module,
        weights: tuple[int, list] | None,
        task_weights: list[float] | None,
        served: Any = None,
    ) -> None:
        seed_everything(cfg.seed)
        torch.set_num_threads(1)
        self.weights: WeightSource = RayServedVersion(served) if served is not None else ActorWeights()
        if weights is not None and isinstance(self.weights, ActorWeights):
            self.weights.offer(weights[0], weights[1][0])
        # In-process: no child shares it, and a process-shared lock would outlive the killed actor.
        self.task_weights = SharedTaskWeights(None)
        if task_weights:
            self.task_weights.set(task_weights)
        self.stop_event = threading.Event()
        self.outbox = Handoff()
        self.beats = 0  # signs of progress, sent with every answer (the trainer's Liveness of it)
        # In-process handles; a rank-wide round signal needs shared memory (RayFleet refuses it).
        self.bundle = SamplerBundle(
            index=index, config=cfg, policy=policy, weights=self.weights, beat=self._beat,
            stop=self.stop_event, task_weights=self.task_weights,
        )  # fmt: skip
        threading.Thread(target=self._run, daemon=True, name="fastlight-sampler").start()

    def _beat(self) -> None:
        self.beats += 1

    def _run(self) -> None:
        self._beat()
        run_sampler(self.bundle, self.outbox)

    def info(self) -> tuple[str, str, int]:
        """Where it runs: (node id, node IP, pid)."""
        return where_it_runs()

    def next_rollout(self, timeout: float) -> tuple[tuple[str, Any, Any], int]:
        """``(item, beats)``: the item ``("rollout", version, Rollout)`` or ``("error", index,
        traceback)``, or after ``timeout`` seconds without one ``("wait", None, None)``; ``beats`` the
        actor's heartbeat count so far."""
        try:
            item = self.outbox.items.get(timeout=timeout)
        except queue.Empty:
            item = ("wait", None, None)
        return item, self.beats

    def set_weights(self, version: int, ref: list) -> None:
        if isinstance(self.weights, ActorWeights):
            self.weights.offer(version, ref[0])

    def set_task_weights(self, weights: list[float]) -> None:
        self.task_weights.set(weights)
