"""``RayFleet``: a rank's samplers as Ray actors, on any node of a Ray cluster.

``--data.fleet.class_path fastlight.fleet.ray.fleet.RayFleet`` runs every sampler of a trainer rank
as an actor of that rank's own placement group (one bundle per sampler: ``num_cpus_per_sampler`` CPUs
plus ``sampler_resources``, e.g. ``{sim: 1}`` to place them on the nodes that advertise ``sim``).
Ray is imported here only, when the fleet starts (``pip install 'fastlight[ray]'``).

What is the same as the local fleet (:class:`~fastlight.fleet.pool.SamplerPool`), because it is
the same code: an actor builds its envs and its :class:`~fastlight.sampling.collector.Collector` with
:func:`~fastlight.sampling.worker.build_collector` from the rank's
:class:`~fastlight.sampling.worker.SamplerConfig` (reset mode, seeds, ``nonfinite``, wrappers) and
runs the sampler process's own loop (:func:`fastlight.sampling.worker._loop`): newest weights at the
start of a round, and with ``max_staleness 0`` no round on weights older than the current version;
DWR task weights before each round (:class:`~fastlight.sampling.task_weights.SharedTaskWeights`).
The trainer side hands the DataModule's prefetcher one Rollout at a time, so the version tag,
``rollout/dropped_stale`` and ``--data.prefetch`` work as they do locally.

What differs is the transport:

- **Data**: every actor has one ``next_rollout`` call in flight; the trainer takes whichever object
  ref completes first (``ray.wait``), so Rollouts arrive in completion order, and issues the next
  call for that actor. An actor holds at most one finished Rollout (as the local sampler's outbox).
- **Weights**: one ``ray.put`` per policy version (a flat float32 array of
  :func:`~fastlight.weights.buckets.sync_entries`, as the shared-memory path); every actor is sent
  its ref and copies it in at its next round. The object store moves it once per node.
  ``sync/*`` reports the put (``mode`` ``ray_object_store``).

With ``--data.inference`` the rank's policy is held by one inference actor instead
(:mod:`fastlight.fleet.ray.inference_actor`, placed by ``inference_resources``; the trainer's end is
:class:`~fastlight.fleet.ray.inference_handle.RayInference`): the samplers act through calls on it, and
each version is broadcast to it over a two-rank ``torch.distributed`` group (``mode`` ``bucketed``).

Faults are fastlight's, not Ray's (actors run with ``max_restarts=0``): an actor that dies (its
process killed, a segfault) or makes no progress for ``--data.faults.heartbeat_s`` is killed and
started again in its bundle on the current weights, within ``--data.faults.max_worker_restarts`` per
``--data.faults.restart_window_s``, counted as ``faults/worker_restarts`` and
``faults/dropped_rollouts``. A node that leaves the cluster is one fault for all the samplers it
held: Ray places their bundles on the remaining nodes if any can take them; if none can within
``placement_timeout_s``, the run stops naming the node and the samplers lost.

Nothing outlives the trainer: :meth:`RaySamplerFleet.stop` kills the actors and removes the
placement group; a Ray instance the fleet started (``address: null``) is shut down with it, one it
joined (``auto``, ``ray://...``) keeps running. If the trainer is SIGKILLed, Ray ends the job's
actors and placement group itself (the driver is gone), and a local instance started by the trainer
dies with it (Ray starts its processes fate-shared with the driver).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn

from fastlight.extras import check_extra, import_extra
from fastlight.fleet.base import Fleet, SamplerFleet
from fastlight.fleet.faults import FLAG, FaultSettings
from fastlight.fleet.ray.inference_handle import RayInference
from fastlight.fleet.ray.reaper import start_reaper
from fastlight.fleet.ray.sampler_actor import SamplerActor, flat_weights
from fastlight.fleet.restarts import SamplerError, crashed, spend_restart
from fastlight.inference.settings import InferenceSettings
from fastlight.models.base import check_policy
from fastlight.procs import children_ignore_stop_signals
from fastlight.rollout import Rollout
from fastlight.sampling.worker import SamplerConfig
from fastlight.weights.buckets import sync_entries
from fastlight.weights.publisher import SyncStats

#: The flag the fleet's own settings live under (errors name it).
SETTINGS = "--data.fleet.init_args"
#: What a missing Ray is reported as.
WHAT = "--data.fleet fastlight.fleet.ray.fleet.RayFleet"
Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
#: How long an actor's ``next_rollout`` waits for a Rollout before it answers with its heartbeat.
POLL_S = 1.0
#: How often ``next_item`` looks at hangs, node losses and replacement placements.
WATCH_EVERY_S = 0.25


def import_ray() -> Any:
    return import_extra("ray", extra="ray", what=WHAT)


@dataclass(frozen=True)
class RayFleet(Fleet):
    """Samplers as Ray actors (see the module docstring).

    Args:
        address: ``null`` starts a Ray instance on this machine for the run (shut down with it);
            ``auto`` joins the cluster this machine is part of (``ray start``), ``ray://host:port``
            or ``host:port`` the one at that address (it keeps running after the run). A Ray
            already initialised in the process (a user's script) is used as it is.
        sampler_resources: Ray resources each sampler needs besides its CPUs, e.g. ``{sim: 1}``:
            samplers go only to nodes started with ``--resources '{"sim": N}'``.
        num_cpus_per_sampler: CPUs each sampler reserves (fractions allowed).
        placement_strategy: how the rank's bundles spread over nodes (Ray's placement strategies).
        placement_timeout_s: how long the cluster may take to place the samplers, at the start and
            after a node leaves, before the run stops naming what cannot be placed.
        inference_resources: with ``--data.inference``, what the rank's inference actor needs
            besides ``num_cpus_inference`` CPUs: ``{GPU: 1}`` (a GPU of its own), a custom resource
            (``{infer: 1}``), or ``null`` (anywhere with the CPUs). Its weights come over a
            ``torch.distributed`` group (:mod:`fastlight.fleet.ray.inference_actor`).
        num_cpus_inference: CPUs the inference actor reserves.
    """

    address: str | None = None
    sampler_resources: dict[str, float] | None = None
    num_cpus_per_sampler: float = 1.0
    placement_strategy: Strategy = "PACK"
    placement_timeout_s: float = 20.0
    inference_resources: dict[str, float] | None = None
    num_cpus_inference: float = 1.0

    def __post_init__(self) -> None:
        check_extra("ray", extra="ray", what=WHAT)  # at parse time: one line, before anything starts
        if not self.num_cpus_per_sampler > 0:
            raise ValueError(f"{SETTINGS}.num_cpus_per_sampler must be > 0, got {self.num_cpus_per_sampler}")
        for name, amount in (self.sampler_resources or {}).items():
            if not amount > 0 or name in ("CPU", "GPU"):
                raise ValueError(
                    f"{SETTINGS}.sampler_resources must map custom resource names to amounts > 0 (CPUs: "
                    f"{SETTINGS}.num_cpus_per_sampler), got {name}: {amount}"
                )
        if self.placement_strategy not in STRATEGIES:
            raise ValueError(
                f"{SETTINGS}.placement_strategy must be one of {' | '.join(STRATEGIES)}, "
                f"got {self.placement_strategy!r}"
            )
        if not self.num_cpus_inference > 0:
            raise ValueError(f"{SETTINGS}.num_cpus_inference must be > 0, got {self.num_cpus_inference}")
        for name, amount in (self.inference_resources or {}).items():
            if not amount > 0 or name == "CPU":
                raise ValueError(
                    f"{SETTINGS}.inference_resources must map GPU or custom resource names to amounts > 0 "
                    f"(CPUs: {SETTINGS}.num_cpus_inference), got {name}: {amount}"
                )
        if not self.placement_timeout_s > 0:
            raise ValueError(f"{SETTINGS}.placement_timeout_s must be > 0, got {self.placement_timeout_s}")

    def bundle(self) -> dict[str, float]:
        """What one sampler reserves: its bundle of the rank's placement group."""
        return {"CPU": float(self.num_cpus_per_sampler), **(self.sampler_resources or {})}

    def build(
        self,
        configs: list[SamplerConfig],
        policy: nn.Module,
        *,
        rank: int,
        inference: InferenceSettings | None,
        trainer_device: torch.device | str,
        example_obs: Any,
        faults: FaultSettings,
        start_method: str,
    ) -> RaySamplerFleet:
        if any(c.truncation_scope == "rank" for c in configs):
            raise ValueError(
                "--data.truncation_scope rank shares the termination rate in the trainer machine's "
                "memory, which Ray actors on other nodes cannot read: use --data.truncation_scope "
                "sampler with --data.fleet RayFleet"
            )
        if inference is not None:
            device = inference.worker_device(trainer_device)
            if device.type == "cuda" and not (self.inference_resources or {}).get("GPU"):
                raise ValueError(
                    f"--data.inference puts the policy on {device} and {SETTINGS}.inference_resources "
                    f"gives the Ray inference actor no GPU ({self.inference_resources}); set it to "
                    "{GPU: 1}, or --data.inference.device cpu"
                )
        return RaySamplerFleet(
            self, configs, policy, rank=rank, faults=faults, inference=inference,
            trainer_device=trainer_device,
        )  # fmt: skip


# -------------------------------------------------------------------------------- the trainer's side
@dataclass
class _Actor:
    """One sampler actor and what the fleet watches of it."""

    index: int
    handle: Any
    created: float
    info_ref: Any
    #: (node id, node IP, pid), once it answered ``info``.
    where: tuple[str, str, int] | None = None
    last_reply: float = 0.0
    started: bool = False
    #: Set for a replacement after a node left: (node id, node IP) of the lost node.
    lost_node: tuple[str, str] | None = None


class RaySamplerFleet(SamplerFleet):
    """The running Ray fleet of one trainer rank (built by :meth:`RayFleet.build`)."""

    def __init__(
        self,
        settings: RayFleet,
        configs: list[SamplerConfig],
        policy: nn.Module,
        *,
        rank: int = 0,
        faults: FaultSettings | None = None,
        inference: InferenceSettings | None = None,
        trainer_device: torch.device | str = "cpu",
    ) -> None:
        check_policy(policy)  # a missing action_mapping must fail here, not in an actor
        self.inference_settings, self.trainer_device = inference, trainer_device
        self.inference: RayInference | None = None  # the rank's inference actor, once started
        self.settings = settings
        self.configs = configs
        self.policy = policy
        self.rank = rank
        self.faults = faults = faults or FaultSettings()
        self.timeout_s, self.heartbeat_s = faults.worker_timeout_s, faults.heartbeat_s
        self.max_restarts, self.restart_window_s = faults.max_worker_restarts, faults.restart_window_s
        self.names = tuple(k for k, _ in sync_entries(policy))
        self.restarts = 0
        self.dropped_rollouts = 0
        self.restart_times: collections.deque[float] = collections.deque()
        self.actors: list[_Actor] = []
        self.pending: dict[Any, int] = {}  # next_rollout refs in flight -> sampler index
        self._weights: tuple[int, Any] | None = None  # (version, ref) of the current weights
        self._task_weights: list[float] | None = None
        self._lock = threading.RLock()  # the prefetch thread's restarts vs the trainer's publish / stop
        self._stopping = False
        self._ray: Any = None
        self._owns_ray = False
        self._reaper: subprocess.Popen | None = None
        self._pg: Any = None
        self._last_item = time.monotonic()
        self._last_watch = 0.0

    @property
    def num_workers(self) -> int:
        return len(self.configs)

    # ---------------------------------------------------------------- start
    def start(self) -> None:
        ray = self._ray = import_ray()
        if not ray.is_initialized():
            self._init_ray(ray)
        from ray.util.placement_group import placement_group

        bundle = self.settings.bundle()
        self._pg = placement_group(
            [dict(bundle) for _ in self.configs],
            strategy=self.settings.placement_strategy,
            name=f"fastlight-rank{self.rank}-{os.getpid()}",
        )
        ready, _ = ray.wait([self._pg.ready()], timeout=self.settings.placement_timeout_s)
        if not ready:
            message = self._unplaceable(f"{len(self.configs)} samplers")
            self.stop()
            raise SamplerError(message)
        if self.inference_settings is not None:
            s = self.settings
            self.inference = RayInference(
                ray, self.policy, self.inference_settings, trainer_device=self.trainer_device,
                resources=dict(s.inference_resources or {}), num_cpus=s.num_cpus_inference,
                samplers=len(self.configs), rank=self.rank,
            )  # fmt: skip
        with self._lock:
            self.actors = [self._create(i) for i in range(len(self.configs))]
        self._last_item = time.monotonic()
        atexit.register(_stop_ref, weakref.ref(self))

    def _init_ray(self, ray: Any) -> None:
        address = self.settings.address
        kwargs: dict[str, Any] = {"logging_level": logging.WARNING}
        if address is None:
            # A new instance for this run, sized for the samplers as the local fleet is (processes
            # beyond the cores just share them), not attached to another instance on this machine.
            wanted = math.ceil(len(self.configs) * self.settings.num_cpus_per_sampler)
            kwargs |= {
                "address": "local",
                "num_cpus": max(os.cpu_count() or 1, wanted),
                "include_dashboard": False,
            }
        else:
            kwargs["address"] = address
        # ray.init replaces the trainer's SIGTERM handler (its preemption checkpoint): put it back. The
        # Ray processes it starts ignore the stop signals, as the local samplers do: a Ctrl-C to the
        # process group is the trainer's to handle, and it stops them itself.
        main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if main else None
        try:
            with children_ignore_stop_signals():
                ray.init(**kwargs)
        finally:
            if main and sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)
        self._owns_ray = True
        if address is None:
            self._reaper = start_reaper(ray)

    def _create(self, i: int, lost_node: tuple[str, str] | None = None) -> _Actor:
        ray = self._ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        s = self.settings
        weights = None if self._weights is None else (self._weights[0], [self._weights[1]])
        handle = (
            ray.remote(SamplerActor)
            .options(
                num_cpus=s.num_cpus_per_sampler,
                resources=dict(s.sampler_resources or {}),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=i
                ),
                max_restarts=0,  # restarts are fastlight's, within its budget
                max_concurrency=4,  # the loop's thread, next_rollout, set_weights, set_task_weights
                name=None,
            )
            .remote(i, self.configs[i], *self._policy_args(), weights, self._task_weights, self._served())
        )
        now = time.monotonic()
        actor = _Actor(i, handle, now, handle.info.remote(), last_reply=now, lost_node=lost_node)
        self.pending[handle.next_rollout.remote(POLL_S)] = i
        return actor

    def _policy_args(self) -> tuple[nn.Module, tuple[str, ...]]:
        """A sampler actor's policy and its published names: a copy, or the inference actor's proxy."""
        if self.inference is not None:
            return self.inference.served_policy(), ()
        return self.policy, self.names

    def _served(self) -> Any:
        return None if self.inference is None else self.inference.handle

    # ---------------------------------------------------------------- weights, task weights
    def publish(self, policy: nn.Module, version: int) -> SyncStats:
        """One ``ray.put`` of the weights for ``version``, each actor sent its ref; or, with an
        inference actor, the broadcast to it."""
        if self.inference is not None:
            self.inference.check()
            return self.inference.publish(policy, version)
        t0 = time.perf_counter()
        flat = flat_weights(policy)
        ref = self._ray.put(flat)
        with self._lock:
            self._weights = (version, ref)
            for a in self.actors:
                a.handle.set_weights.remote(version, [ref])
        ms = 1000.0 * (time.perf_counter() - t0)
        return SyncStats(version, "ray_object_store", ms, flat.nbytes, 1, ms)

    def request_drain(self) -> None:
        """The inference actor's drain; without one nothing to drain (actors pick the new weights up
        between rounds)."""
        if self.inference is not None:
            self.inference.request_drain()

    def set_task_weights(self, weights: list[float]) -> None:
        with self._lock:
            self._task_weights = list(weights)
            for a in self.actors:
                a.handle.set_task_weights.remote(self._task_weights)

    # ---------------------------------------------------------------- data
    def next_item(self, timeout: float) -> Rollout | None:
        ray = self._ray
        self.watch()
        with self._lock:
            refs = list(self.pending)
        done, _ = ray.wait(refs, num_returns=1, timeout=timeout) if refs else ([], [])
        if not done:
            self.watch(force=True)
            if time.monotonic() - self._last_item > self.timeout_s:
                raise SamplerError(
                    f"no rollout from the Ray samplers for {self.timeout_s:.0f} s "
                    f"({FLAG}.worker_timeout_s); {self._describe()}"
                )
            return None
        with self._lock:
            if self._stopping:
                return None
            i = self.pending.pop(done[0], None)
            if i is None:  # a call of an actor replaced meanwhile
                return None
            actor = self.actors[i]
            try:
                kind, tag, payload = ray.get(done[0])
            except ray.exceptions.RayActorError as e:
                self._died(actor, _first_line(e))
                return None
            actor.last_reply = time.monotonic()
            if kind == "error":
                if self.inference is not None:  # its death fails every sampler's call: name the cause
                    self.inference.check(wait_s=2.0)
                raise SamplerError(crashed(i, payload))
            self.pending[actor.handle.next_rollout.remote(POLL_S)] = i
            if kind == "wait":
                actor.started = actor.started or bool(payload)
                limit = self.heartbeat_s if actor.started else self.timeout_s
                if tag > limit:
                    self._hung(actor, f"made no progress for {tag:.0f} s", limit)
                return None
        self._last_item = time.monotonic()
        actor.started = True
        # Writable copies: what ray.get returns is read-only memory of the object store.
        return payload.map(lambda a: torch.from_numpy(np.array(a)))

    # ---------------------------------------------------------------- faults
    def watch(self, force: bool = False) -> None:
        """Where each actor runs (logged once), replacements that cannot be placed, silent actors."""
        now = time.monotonic()
        if not force and now - self._last_watch < WATCH_EVERY_S:
            return
        self._last_watch = now
        ray = self._ray
        with self._lock:
            if self._stopping:
                return
            if self.inference is not None:
                self.inference.check()
            for a in list(self.actors):
                if a.where is None:
                    ready, _ = ray.wait([a.info_ref], timeout=0)
                    if ready:
                        try:
                            a.where = ray.get(a.info_ref)
                        except ray.exceptions.RayActorError:
                            continue  # its pending call reports the death
                        node, ip, pid = a.where
                        a.lost_node = None  # placed: watched as any other from here on
                        line = (
                            f"sampler {a.index} (rank {self.rank}) runs on Ray node {node} ({ip}), pid {pid}"
                        )
                        print(f"fastlight: {line}", file=sys.stderr, flush=True)
                    elif a.lost_node is not None and now - a.created > self.settings.placement_timeout_s:
                        lost = sorted(b.index for b in self.actors if b.lost_node == a.lost_node)
                        node, ip = a.lost_node
                        raise SamplerError(
                            f"Ray node {node} ({ip}) left the cluster with samplers {lost} of rank "
                            f"{self.rank}; " + self._unplaceable(f"they ({len(lost)} samplers)")
                        )
                limit = self.heartbeat_s if a.started else self.timeout_s
                if a.lost_node is None and now - a.last_reply > limit + POLL_S:
                    # no answer at all (a stopped process, a wedged worker): its call is overdue
                    self._hung(a, f"has not answered for {now - a.last_reply:.0f} s", limit)

    def _name(self, a: _Actor) -> str:
        where = "" if a.where is None else f", pid {a.where[2]}, Ray node {a.where[0]} ({a.where[1]})"
        return f"sampler {a.index} (Ray actor{where}, env {self.configs[a.index].env_id})"

    def _hung(self, a: _Actor, what: str, limit: float) -> None:
        flag = f"{FLAG}.heartbeat_s" if a.started else f"{FLAG}.worker_timeout_s"
        self._replace([a], f"{self._name(a)} {what} ({flag} {limit:g}); killed it", "restarting it")

    def _died(self, a: _Actor, why: str) -> None:
        """Actor ``a`` died: alone, or with its node (then every sampler the node held, one fault)."""
        node = self._dead_node(a)
        if node is None:
            return self._replace([a], f"{self._name(a)} died: {why}", "restarting it")
        lost = [b for b in self.actors if b.where is not None and b.where[0] == node[0]] or [a]
        names = ", ".join(str(b.index) for b in lost)
        self._replace(
            lost,
            f"Ray node {node[0]} ({node[1]}) left the cluster, and with it samplers {names} of rank "
            f"{self.rank}",
            f"placing them on the remaining nodes (within {SETTINGS}.placement_timeout_s "
            f"{self.settings.placement_timeout_s:g})",
            lost_node=node,
        )

    def _dead_node(self, a: _Actor) -> tuple[str, str] | None:
        if a.where is None:
            return None
        node_id = a.where[0]
        for n in self._ray.nodes():
            if n.get("NodeID") == node_id:
                return None if n.get("Alive") else (node_id, str(n.get("NodeManagerAddress", a.where[1])))
        return node_id, a.where[1]

    def _replace(
        self, lost: list[_Actor], what: str, action: str, lost_node: tuple[str, str] | None = None
    ) -> None:
        """Kill ``lost`` and start them again (one restart of the budget), else stop naming ``what``."""
        for a in lost:
            self._kill(a)
        if not self._spend_restart(
            what, action + " (their rounds in flight dropped)" if len(lost) > 1 else action
        ):
            return
        self.dropped_rollouts += len(lost)
        for a in lost:
            self.actors[a.index] = self._create(a.index, lost_node=lost_node)

    def _kill(self, a: _Actor) -> None:
        for ref, i in list(self.pending.items()):
            if i == a.index:
                del self.pending[ref]
        with contextlib.suppress(Exception):  # already dead, or its node gone
            self._ray.kill(a.handle, no_restart=True)

    def _spend_restart(self, name: str, action: str) -> bool:
        """One restart from the budget (the local pool's rule and wording); raises past it."""
        if self._stopping:
            return False
        spend_restart(self.restart_times, max_restarts=self.max_restarts, window_s=self.restart_window_s,
                      name=name, action=action)  # fmt: skip
        self.restarts += 1
        return True

    def _unplaceable(self, what: str) -> str:
        ray = self._ray
        bundle = self.settings.bundle()
        try:
            total = ray.cluster_resources()
        except Exception:
            total = {}
        missing = sorted(k for k in bundle if k not in total)
        why = f"no node advertises {missing}" if missing else f"the cluster has {_resources(total, bundle)}"
        return (
            f"{what} cannot be placed within {SETTINGS}.placement_timeout_s "
            f"{self.settings.placement_timeout_s:g} (each needs {bundle}; {why}); "
            "`ray status` lists the nodes and their resources"
        )

    def _describe(self) -> str:
        return "; ".join(
            f"{self._name(a)}: {'started' if a.started else 'starting'}, last answer "
            f"{time.monotonic() - a.last_reply:.0f} s ago"
            for a in self.actors
        )

    def sampler_nodes(self) -> list[str | None]:
        """The Ray node id each sampler runs on, by index (None until it answered)."""
        self.watch(force=True)
        return [None if a.where is None else a.where[0] for a in self.actors]

    def sampler_pids(self, timeout: float = 60.0) -> list[int]:
        """The pid of each sampler's actor process (waits for them to start)."""
        return [self._ray.get(a.info_ref, timeout=timeout)[2] for a in self.actors]

    # ---------------------------------------------------------------- stop
    def stop(self, timeout: float = 30.0) -> None:
        """Kill the actors, remove the placement group, and shut down a Ray instance this fleet
        started (one it joined keeps running). Idempotent; nothing restarts once it has begun."""
        self._stopping = True
        locked = self._lock.acquire(timeout=timeout)
        try:
            ray = self._ray
            if ray is None:
                return
            for a in self.actors:
                self._kill(a)
            self.actors, self.pending = [], {}
            if self.inference is not None:
                self.inference.stop()
                self.inference = None
            if self._pg is not None:
                with contextlib.suppress(Exception):
                    from ray.util.placement_group import remove_placement_group

                    remove_placement_group(self._pg)
                self._pg = None
            self._weights = None
            if self._owns_ray:
                with contextlib.suppress(Exception):
                    ray.shutdown()
                self._owns_ray = False
            if self._reaper is not None:  # what ray.shutdown left (agents still exiting) goes now
                self._reaper.stdin.close()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._reaper.wait(timeout=10.0)
                self._reaper = None
            self._ray = None
        finally:
            if locked:
                self._lock.release()


def _stop_ref(ref: weakref.ref) -> None:
    fleet = ref()
    if fleet is not None:
        fleet.stop()


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _resources(total: dict[str, float], bundle: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {total.get(k, 0):g}" for k in bundle) + "} in all"
