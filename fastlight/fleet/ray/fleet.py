"""``RayFleet``: a rank's samplers as Ray actors, on any node of a Ray cluster.

``--data.fleet.class_path fastlight.fleet.ray.fleet.RayFleet`` runs every sampler of a trainer rank
as an actor of that rank's own placement group (one bundle per sampler). Ray is imported only when
the fleet starts (``pip install 'fastlight[ray]'``). An actor runs the local sampler's own loop
(:func:`fastlight.sampling.worker.run_sampler`), so staleness, DWR task weights and the prefetcher
work as they do locally. What differs is the transport:

- **Data**: every actor has one ``next_rollout`` call in flight; the trainer takes whichever ref
  completes first (``ray.wait``) and issues the next call for that actor.
- **Weights**: one ``ray.put`` per policy version (packed buckets,
  :class:`~fastlight.fleet.ray.sampler_actor.StoreWeights`); every actor is sent its ref and copies it
  in at its next round (``sync/*`` ``mode`` ``ray_object_store``). With ``--data.inference`` one
  inference actor holds the policy instead (:mod:`fastlight.fleet.ray.inference_actor`), sent each
  version over a two-rank ``torch.distributed`` group.

Faults are fastlight's, not Ray's (``max_restarts=0``; :class:`~fastlight.fleet.base.SamplerFleet`):
a dead or silent actor is started again in its bundle within the restart budget. A node that leaves
the cluster is one fault for all the samplers it held: Ray places them on the remaining nodes, or
the run stops after ``placement_timeout_s`` naming the node.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn

from fastlight.extras import check_extra
from fastlight.fleet.base import Fleet, FleetBuild, SamplerFleet
from fastlight.fleet.faults import SamplerError, crashed, env_raised
from fastlight.fleet.ray.actors import ActorRecord, first_line, moved_line
from fastlight.fleet.ray.cluster import SETTINGS, WHAT, RayCluster
from fastlight.fleet.ray.inference_handle import RayInference
from fastlight.fleet.ray.sampler_actor import SamplerActor, StoreWeights
from fastlight.procs import Liveness
from fastlight.rollout import Rollout
from fastlight.weights.publisher import SyncStats

Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
#: How long an actor's ``next_rollout`` waits for a Rollout before it answers with its heartbeat.
POLL_S = 1.0


@dataclass(frozen=True)
class RayFleet(Fleet):
    """Samplers as Ray actors (see the module docstring).

    Args:
        address: ``null`` starts a Ray instance on this machine for the run (shut down with it);
            ``auto`` joins the cluster this machine is part of, ``ray://host:port`` or ``host:port``
            the one at that address. A Ray already initialised in the process is used as it is.
        allow_unauthenticated: join a cluster whose authentication is disabled (refused by default:
            anyone who reaches its ports can run code on its nodes).
        sampler_resources: Ray resources each sampler needs besides its CPUs, e.g. ``{sim: 1}``:
            samplers go only to nodes started with ``--resources '{"sim": N}'``.
        num_cpus_per_sampler: CPUs each sampler reserves (fractions allowed).
        placement_strategy: how the rank's bundles spread over nodes (Ray's placement strategies).
        placement_timeout_s: how long the cluster may take to place the samplers, at the start and
            after a node leaves, before the run stops naming what cannot be placed.
        inference_resources: with ``--data.inference``, what the rank's inference actor needs
            besides ``num_cpus_inference`` CPUs: ``{GPU: 1}``, a custom resource, or ``null``.
        num_cpus_inference: CPUs the inference actor reserves.
    """

    address: str | None = None
    allow_unauthenticated: bool = False
    sampler_resources: dict[str, float] | None = None
    num_cpus_per_sampler: float = 1.0
    placement_strategy: Strategy = "PACK"
    placement_timeout_s: float = 20.0
    inference_resources: dict[str, float] | None = None
    num_cpus_inference: float = 1.0

    def __post_init__(self) -> None:
        check_extra("ray", extra="ray", what=WHAT)  # at parse time: one line, before anything starts
        positive = {"num_cpus_per_sampler": self.num_cpus_per_sampler, "num_cpus_inference":
                    self.num_cpus_inference, "placement_timeout_s": self.placement_timeout_s}  # fmt: skip
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{SETTINGS}.{name} must be > 0, got {value}")
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
        for name, amount in (self.inference_resources or {}).items():
            if not amount > 0 or name == "CPU":
                raise ValueError(
                    f"{SETTINGS}.inference_resources must map GPU or custom resource names to amounts > 0 "
                    f"(CPUs: {SETTINGS}.num_cpus_inference), got {name}: {amount}"
                )

    def bundle(self) -> dict[str, float]:
        """What one sampler reserves: its bundle of the rank's placement group."""
        return {"CPU": float(self.num_cpus_per_sampler), **(self.sampler_resources or {})}

    def build(self, build: FleetBuild) -> RaySamplerFleet:
        if any(c.rank_rounds == "together" for c in build.configs):
            raise ValueError(
                "--data.rank_rounds together signals through the trainer machine's memory, which Ray "
                "actors on other nodes cannot read: use --data.rank_rounds apart with --data.fleet RayFleet"
            )
        if build.inference is not None:
            device = build.inference.worker_device(build.trainer_device)
            if device.type == "cuda" and not (self.inference_resources or {}).get("GPU"):
                raise ValueError(
                    f"--data.inference puts the policy on {device} and {SETTINGS}.inference_resources "
                    f"gives the Ray inference actor no GPU ({self.inference_resources}); set it to "
                    "{GPU: 1}, or --data.inference.device cpu"
                )
        return RaySamplerFleet(self, build)


# -------------------------------------------------------------------------------- the trainer's side
class RaySamplerFleet(SamplerFleet):
    """The running Ray fleet of one trainer rank (built by :meth:`RayFleet.build`)."""

    samplers_name = "Ray samplers"

    def __init__(self, settings: RayFleet, build: FleetBuild) -> None:
        super().__init__(build)
        self.inference: RayInference | None = None  # the rank's inference actor, once started
        self.settings, self.rank = settings, build.rank
        self._cluster = RayCluster(settings, rank=build.rank, samplers=len(build.configs))
        self._store: StoreWeights | None = None  # the packed weights put per version, from the first
        self.actors: list[ActorRecord] = []
        self.pending: dict[Any, int] = {}  # next_rollout refs in flight -> sampler index
        self._weights: tuple[int, Any] | None = None  # (version, ref) of the current weights
        self._task_weights: list[float] | None = None
        self._read_at = time.monotonic()  # when the trainer last read the actors' answers

    @property
    def _ray(self) -> Any:
        return self._cluster.ray

    def _start(self) -> None:
        ray = self._cluster.connect()
        if self.build.inference is not None:
            s = self.settings
            self.inference = RayInference(
                ray, self.build, resources=dict(s.inference_resources or {}), num_cpus=s.num_cpus_inference
            )
            try:  # before the samplers: they would wait on it, and be blamed for it
                self.inference.wait_placed(s.placement_timeout_s)
            except SamplerError:
                self._stop()
                raise
        with self._lock:
            self.actors = [self._create(i) for i in range(len(self.configs))]

    def _create(self, i: int, lost_node: tuple[str, str] | None = None) -> ActorRecord:
        ray = self._ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        s = self.settings
        weights = None if self._weights is None else (self._weights[0], [self._weights[1]])
        # max_concurrency: the loop's thread, next_rollout, set_weights, set_task_weights.
        actor = ray.remote(SamplerActor).options(
            num_cpus=s.num_cpus_per_sampler, resources=dict(s.sampler_resources or {}), max_restarts=0,
            max_concurrency=4, scheduling_strategy=PlacementGroupSchedulingStrategy(self._cluster.pg, i),
        )  # fmt: skip
        served = None if self.inference is None else self.inference.handle
        policy = self.policy if self.inference is None else self.inference.served_policy()
        handle = actor.remote(i, self.configs[i], policy, weights, self._task_weights, served)
        liveness = Liveness(None, self.heartbeat_limits)  # watched from now: start-up limit first
        info = handle.info.remote()
        self.pending[handle.next_rollout.remote(POLL_S)] = i
        return ActorRecord(
            i, handle, time.monotonic(), info, liveness, lost_node=lost_node, moved_from=lost_node
        )

    # ---------------------------------------------------------------- weights, task weights
    def publish(self, policy: nn.Module, version: int) -> SyncStats:
        """One ``ray.put`` of the weights for ``version``, each actor sent its ref; or, with an
        inference actor, the broadcast to it."""
        if self.inference is not None:
            self.inference.check()
            return self.inference.publish(policy, version)
        t0 = time.perf_counter()
        if self._store is None:
            self._store = StoreWeights(policy)
        ref = self._store.put(self._ray, policy)
        with self._lock:
            self._weights = (version, ref)
            for a in self.actors:
                a.handle.set_weights.remote(version, [ref])
        ms = 1000.0 * (time.perf_counter() - t0)
        return SyncStats(version, "ray_object_store", ms, self._store.nbytes, 1, ms)

    def request_drain(self) -> None:
        """The inference actor's drain; without one nothing to drain."""
        if self.inference is not None:
            self.inference.request_drain()

    def set_task_weights(self, weights: list[float]) -> None:
        with self._lock:
            self._task_weights = list(weights)
            for a in self.actors:
                a.handle.set_task_weights.remote(self._task_weights)

    def _receive(self, timeout: float) -> Rollout | None:
        ray = self._ray
        with self._lock:
            refs = list(self.pending)
        done, _ = ray.wait(refs, num_returns=1, timeout=timeout) if refs else ([], [])
        self._read_at = time.monotonic()
        if not done:
            return None
        with self._lock:
            if self.stopping:
                return None
            if (i := self.pending.pop(done[0], None)) is None:  # a call of an actor replaced meanwhile
                return None
            actor = self.actors[i]
            try:
                (kind, tag, payload), beats = ray.get(done[0])
            except ray.exceptions.ActorUnavailableError:
                # Not a death (a raylet SIGKILLed, a network cut): ask again until Ray decides
                # (fastlight.fleet.ray.actors); Ray paces the failures, one every few seconds.
                if actor.unreachable_since is None:
                    actor.unreachable_since = time.monotonic()
                self.pending[actor.handle.next_rollout.remote(POLL_S)] = i
                return None
            except ray.exceptions.RayActorError as e:
                self._died(actor, first_line(e))
                return None
            actor.unreachable_since = None
            actor.liveness.report(beats)
            if kind == "error":
                if self.inference is not None:  # its death fails every sampler's call: name the cause
                    self.inference.check(wait_s=2.0)
                env_error = env_raised(payload)
                if env_error is None:
                    raise SamplerError(crashed(i, payload))
                # An env threw (a flaky simulator): restarted within the budget, as a local sampler is.
                self._replace([actor], f"{self._name(actor)} crashed: {env_error}", "restarting it")
                return None
            self.pending[actor.handle.next_rollout.remote(POLL_S)] = i
            if kind == "wait":  # its heartbeat only: the watch judges it
                return None
        # Writable copies: what ray.get returns is read-only memory of the object store.
        return payload.map(lambda a: torch.from_numpy(np.array(a)))

    # ---------------------------------------------------------------- faults
    def _watch(self, now: float) -> None:
        """Where each actor runs (logged once), replacements that cannot be placed, silent actors."""
        if self.inference is not None:
            self.inference.check()
        # An actor's beats reach its Liveness only when the trainer reads its answers: after a pause
        # in reading (the prefetch queue full through a long update), silence counts from now.
        unread = now - self._read_at > POLL_S
        for a in list(self.actors):
            if unread:
                a.liveness.reset()
            if a.where is None:
                self._locate(a, now)
            hung = a.liveness.hang(now) if a.judged(now) else None
            if hung is not None:
                self._replace([a], f"{self._name(a)} {hung}; killed it", "restarting it")

    def _locate(self, a: ActorRecord, now: float) -> None:
        """Where actor ``a`` runs, once it answered ``info`` (logged once); a replacement for a lost
        node that is not placed within ``placement_timeout_s`` stops the run, naming the node."""
        ray = self._ray
        ready, _ = ray.wait([a.info_ref], timeout=0)
        if ready:
            try:
                a.where = ray.get(a.info_ref)
            except ray.exceptions.ActorUnavailableError:
                a.info_ref = a.handle.info.remote()  # not a death: ask again (see _receive)
                return
            except ray.exceptions.RayActorError:
                return  # its pending call reports the death
            node, ip, pid = a.where
            a.lost_node = None  # placed: watched as any other from here on
            if a.moved_from is not None:  # a replacement after a node left: one line for all of them
                if (moved := moved_line(a.moved_from, self.actors, self.rank)) is not None:
                    print(f"fastlight: {moved}", file=sys.stderr, flush=True)
                return
            line = f"sampler {a.index} (rank {self.rank}) runs on Ray node {node} ({ip}), pid {pid}"
            print(f"fastlight: {line}", file=sys.stderr, flush=True)
        elif a.lost_node is not None and now - a.created > self.settings.placement_timeout_s:
            lost = sorted(b.index for b in self.actors if b.lost_node == a.lost_node)
            node, ip = a.lost_node
            raise SamplerError(
                f"Ray node {node} ({ip}) left the cluster with samplers {lost} of rank "
                f"{self.rank}; " + self._cluster.unplaceable(f"they ({len(lost)} samplers)")
            )

    def _name(self, a: ActorRecord) -> str:
        where = "" if a.where is None else f", pid {a.where[2]}, Ray node {a.where[0]} ({a.where[1]})"
        return f"sampler {a.index} (Ray actor{where}, env {self.configs[a.index].env_id})"

    def _died(self, a: ActorRecord, why: str) -> None:
        """Actor ``a`` died: alone, or with its node (then every sampler the node held, one fault)."""
        node = None if a.where is None else self._cluster.dead_node(a.where[0], a.where[1])
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

    def _replace(
        self, lost: list[ActorRecord], what: str, action: str, lost_node: tuple[str, str] | None = None
    ) -> None:
        """Kill ``lost`` and start them again (one restart of the budget), else stop naming ``what``."""
        for a in lost:
            self._kill(a)
        action += " (their rounds in flight dropped)" if len(lost) > 1 else ""
        if not self._spend_restart(what, action, dropped=len(lost)):
            return
        for a in lost:
            self.actors[a.index] = self._create(a.index, lost_node=lost_node)

    def _kill(self, a: ActorRecord) -> None:
        self.pending = {ref: i for ref, i in self.pending.items() if i != a.index}
        with contextlib.suppress(Exception):  # already dead, or its node gone
            self._ray.kill(a.handle, no_restart=True)

    def _describe(self) -> str:
        return "; ".join(
            f"{self._name(a)}: {'started' if a.liveness.started else 'starting'}, no progress seen for "
            f"{a.liveness.silent_for():.0f} s"
            for a in self.actors
        )

    def _stop(self) -> None:
        """Kill every actor, remove the placement group, shut down a Ray instance this fleet started."""
        for a in self.actors:
            self._kill(a)
        self.actors, self.pending = [], {}
        if self.inference is not None:
            self.inference.stop()
            self.inference = None
        self._weights = None
        self._cluster.close()
