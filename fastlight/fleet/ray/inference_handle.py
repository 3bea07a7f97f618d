"""The trainer's end of a Ray fleet's inference worker: :class:`RayInference` places the rank's
:class:`~fastlight.fleet.ray.inference_actor.InferenceActor`, hosts the two-rank weight group at the
trainer's node address, publishes every version over it and watches the actor (a dead actor stops
the run, naming it and its node)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch
from torch import nn

from fastlight.fleet.base import FleetBuild
from fastlight.fleet.faults import SamplerError
from fastlight.fleet.ray.actors import first_line
from fastlight.fleet.ray.cluster import SETTINGS, offered
from fastlight.fleet.ray.inference_actor import InferenceActor, RayServedPolicy
from fastlight.inference.settings import FLAG as INFERENCE_FLAG
from fastlight.weights.broadcast import LazyBroadcaster, SyncGroupConfig, WeightSyncError, free_port
from fastlight.weights.publisher import SyncStats


class RayInference:
    """One rank's inference actor, seen from its trainer (see the module docstring)."""

    def __init__(self, ray: Any, build: FleetBuild, *, resources: dict[str, float], num_cpus: float) -> None:
        """The actor for ``build``'s rank and samplers (``build.inference`` set), placed with
        ``num_cpus`` CPUs and ``resources``."""
        settings, policy = build.inference, build.policy
        assert settings is not None
        self.ray, self.rank = ray, build.rank
        self.trainer_device = torch.device(build.trainer_device)
        self.worker_device = settings.worker_device(self.trainer_device)
        host = ray.util.get_node_ip_address()  # the trainer's address, as the actor's node sees it
        # NCCL when both ends hold CUDA weights (the actor has a GPU of its own), gloo otherwise.
        backend = "nccl" if self.trainer_device.type == self.worker_device.type == "cuda" else "gloo"
        self.sync = SyncGroupConfig(host, free_port(host), backend, timeout_s=settings.sync_timeout_s)
        self.broadcast = LazyBroadcaster(self.sync, settings.sync_bucket_mb)
        extra = dict(resources)
        gpus = extra.pop("GPU", 0.0)
        self.asked = {"CPU": num_cpus, "GPU": gpus, **extra} if gpus else {"CPU": num_cpus, **extra}
        # One thread per sampler's call, plus wait_ended, info, weights_version and stop.
        threads = len(build.configs) + 4
        actor = ray.remote(InferenceActor).options(
            num_cpus=num_cpus, num_gpus=gpus, resources=extra, max_restarts=0, max_concurrency=threads
        )
        self.handle = actor.remote(
            policy, self.sync, device=str(self.worker_device), max_batch=settings.max_batch,
            max_wait_ms=settings.max_wait_ms, bucket_mb=settings.sync_bucket_mb,
        )  # fmt: skip
        self.info_ref = self.handle.info.remote()
        self.ended_ref = self.handle.wait_ended.remote()
        self.where: tuple[str, str, int] | None = None
        self.action_mapping = policy.action_mapping()

    def served_policy(self) -> RayServedPolicy:
        """What each sampler actor acts with: calls on this actor."""
        return RayServedPolicy(self.handle, self.action_mapping)

    def publish(self, policy: nn.Module, version: int) -> SyncStats:
        """Broadcast ``policy``'s weights as ``version``; returns once the actor acked them."""
        try:
            return self.broadcast.publish(policy, version)
        except WeightSyncError as e:
            self.check(wait_s=2.0)  # a dead actor is the better message
            raise SamplerError(f"weight sync with the {self.name()} failed: {e}") from e

    def request_drain(self) -> None:
        """AcceRL §inference drain: announce the sync before the update ends."""
        self.broadcast.request_drain()

    def wait_placed(self, timeout_s: float) -> None:
        """Wait until Ray gives the actor a node; raise :class:`SamplerError` naming what it asks and what
        each node has free if none does within ``timeout_s``."""
        ray = self.ray
        ready, _ = ray.wait([self.info_ref], timeout=timeout_s)
        if ready or self._placed():
            return
        raise SamplerError(
            f"the {self.name()} cannot be placed within {SETTINGS}.placement_timeout_s {timeout_s:g}: it "
            f"asks {self.asked}, and the nodes have free {offered(ray, self.asked)} (the rank's samplers "
            f"reserved theirs first); lower {SETTINGS}.num_cpus_inference or inference_resources, or add "
            "a node that has them; `ray status` lists the nodes and their resources"
        )

    def _placed(self) -> bool:
        """Whether Ray gave the actor a node (it may still be starting there); True where it cannot tell."""
        try:
            from ray._private import state

            record = state.actors(actor_id=self.handle._actor_id.hex())
            return record["State"] == "ALIVE" or bool(record["Pid"])  # a worker leased for it: placed
        except Exception:
            return True

    def check(self, wait_s: float = 0.0) -> None:
        """Raise :class:`SamplerError` naming the actor if it died or its serving loop failed."""
        ray = self.ray
        if self.where is None and ray.wait([self.info_ref], timeout=0)[0]:  # placed: where, said once
            with contextlib.suppress(ray.exceptions.RayActorError):
                self.where = ray.get(self.info_ref)
                node, ip, pid = self.where
                line = f"inference worker (rank {self.rank}) runs on Ray node {node} ({ip}), pid {pid}"
                print(f"fastlight: {line}", file=sys.stderr, flush=True)
        ended, _ = ray.wait([self.ended_ref], timeout=wait_s)
        if not ended:
            return
        try:
            error = ray.get(self.ended_ref)
            why = f"failed:\n{error}" if error else "stopped"
        except ray.exceptions.RayActorError as e:
            why = f"died: {first_line(e)}"
        raise SamplerError(
            f"{self.name()} {why}; the Ray fleet does not restart it (its weights come over a "
            f"broadcast group that would need a new rendezvous); {INFERENCE_FLAG} null keeps a policy "
            "copy in every sampler instead"
        )

    def name(self) -> str:
        w = self.where
        where = "" if w is None else f", pid {w[2]}, Ray node {w[0]} ({w[1]})"
        return f"inference worker (Ray actor{where}, rank {self.rank})"

    def stop(self) -> None:
        """Kill the actor and close the group (idempotent)."""
        with contextlib.suppress(Exception):
            self.ray.kill(self.handle, no_restart=True)
        with contextlib.suppress(Exception):
            self.broadcast.close()
