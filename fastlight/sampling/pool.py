"""``SamplerPool``: the trainer-side handle on a rank's sampler processes.

It spawns them, publishes weights, hands out their Rollouts one item at a time (the
DataModule's prefetcher assembles super-batches), and stops them. A sampler that raises sends
its traceback, which is re-raised here naming the worker; one that dies without a word is
found through its exit code. Nothing waits forever: ``next_item`` gives up after ``timeout_s`` without data.
"""

from __future__ import annotations

import atexit
import os
import queue
import time
import weakref
from typing import Any

import torch.multiprocessing as tmp
from torch import nn

from fastlight.inference.client import InferenceClient
from fastlight.models.base import check_policy
from fastlight.rollout import Rollout
from fastlight.sampling.child import children_ignore_sigint
from fastlight.sampling.task_weights import SharedTaskWeights
from fastlight.sampling.worker import SamplerConfig, rollout_from_numpy, sampler_main
from fastlight.weights.publisher import SyncStats, WeightPublisher, WeightSource
from fastlight.weights.shared_memory import SharedWeights


class SamplerError(RuntimeError):
    """A sampler process failed; the message names it and carries its traceback."""


class SamplerPool:
    """Sampler processes of one trainer rank, each with a policy copy - or, with ``inference``
    settings (``max_batch``, ``max_wait_ms``, ``bucket_mb``, ``sync_timeout_s``), all served by
    one inference worker (``example_obs`` then gives the observation layout)."""

    def __init__(
        self,
        configs: list[SamplerConfig],
        policy: nn.Module,
        *,
        timeout_s: float = 300.0,
        inference: dict[str, Any] | None = None,
        example_obs: Any = None,
    ) -> None:
        check_policy(policy)  # a missing action_mapping must fail here, not in a child process
        self.configs = configs
        self.policy = policy
        self.timeout_s = timeout_s
        self.ctx = tmp.get_context("spawn")
        self.client: InferenceClient | None = None
        if inference is not None:
            self.client = InferenceClient(
                self.ctx, policy, example_obs, [c.num_envs for c in configs], **inference
            )
        # One publisher (trainer end) and what the samplers read (their end) for either path.
        self.publisher: WeightPublisher
        self.weights: WeightSource
        if self.client is None:
            shared = SharedWeights(policy, self.ctx)
            self.publisher, self.weights = shared, shared
        else:
            self.publisher, self.weights = self.client, self.client.weights_source()
        self.task_weights = SharedTaskWeights(self.ctx)
        self.queue = self.ctx.Queue(maxsize=2 * len(configs))
        self.stop_event = self.ctx.Event()
        self.procs: list = []
        self._last_item = time.monotonic()

    @property
    def num_workers(self) -> int:
        return len(self.configs)

    def start(self) -> None:
        with children_ignore_sigint():  # Ctrl-C is the trainer's to handle (quietly, with a checkpoint)
            self._start_processes()
        self._last_item = time.monotonic()
        # Last line of defence if the trainer exits without teardown.
        atexit.register(_stop_ref, weakref.ref(self))

    def _start_processes(self) -> None:
        for i, cfg in enumerate(self.configs):
            policy = self.policy if self.client is None else self.client.remote_policy(i, self.policy)
            p = self.ctx.Process(
                target=sampler_main,
                args=(
                    i,
                    cfg,
                    policy,
                    self.weights,
                    self.queue,
                    self.stop_event,
                    os.getpid(),
                    self.task_weights,
                ),
                name=f"fastlight-sampler-{i}",
                daemon=True,
            )
            p.start()
            self.procs.append(p)
        if self.client is not None:
            self.client.close_sampler_ends()
            self.client.start(self.stop_event, os.getpid())

    def publish(self, policy: nn.Module, version: int) -> SyncStats:
        """New weights for the samplers through the pool's one publisher."""
        try:
            return self.publisher.publish(policy, version)
        except Exception as e:
            if self.client is None:
                raise
            raise SamplerError(f"weight sync with the inference worker failed: {e}") from e

    def request_drain(self) -> None:
        """Announce the next ``publish`` (AcceRL §inference drain; a no-op for shared memory)."""
        self.publisher.request_drain()

    def next_item(self, timeout: float) -> Rollout | None:
        """One sampler item (a Rollout), or None if none arrived within ``timeout``.

        Raises :class:`SamplerError` naming the worker if a sampler crashed, and if nothing at
        all arrived for ``timeout_s`` (``--data.worker_timeout_s``).
        """
        try:
            kind, tag, payload = self.queue.get(timeout=timeout)
        except queue.Empty:
            self._check_alive()
            if time.monotonic() - self._last_item > self.timeout_s:
                raise SamplerError(
                    f"no rollout from the samplers for {self.timeout_s:.0f} s (--data.worker_timeout_s); "
                    f"alive: {[p.is_alive() for p in self.procs]}"
                ) from None
            return None
        if kind == "error":  # tag = worker index
            raise SamplerError(f"sampler worker {tag} ({self.procs[tag].name}) crashed:\n{payload}")
        self._last_item = time.monotonic()
        return rollout_from_numpy(payload)

    def _check_alive(self) -> None:
        if self.client is not None:
            try:
                self.client.check_alive()
            except RuntimeError as e:
                raise SamplerError(str(e)) from None
        for i, p in enumerate(self.procs):
            if not p.is_alive():
                # Give a dying worker's error message a moment to arrive through the queue.
                try:
                    kind, who, payload = self.queue.get(timeout=1.0)
                    if kind == "error":
                        raise SamplerError(
                            f"sampler worker {who} ({self.procs[who].name}) crashed:\n{payload}"
                        )
                except queue.Empty:
                    pass
                raise SamplerError(
                    f"sampler worker {i} ({p.name}, pid {p.pid}) died with exit code {p.exitcode}"
                )

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every sampler: ask, then terminate, then kill. Idempotent."""
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        for p in self.procs:
            # Keep the queue drained meanwhile: a sampler exits only once its queue feeder thread
            # has flushed the last item into the pipe, which a full pipe would block until killed.
            while p.is_alive() and time.monotonic() < deadline:
                self._drain()
                p.join(timeout=0.05)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
        self.procs = []
        if self.client is not None:
            self.client.stop()
        self._drain()  # so the queue's feeder thread can exit

    def _drain(self) -> None:
        try:
            while True:
                self.queue.get_nowait()
        except (queue.Empty, OSError, ValueError):
            pass


def _stop_ref(ref: weakref.ref) -> None:
    pool = ref()
    if pool is not None:
        pool.stop()
