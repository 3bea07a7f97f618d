"""The Ray cluster under one rank's :class:`~fastlight.fleet.ray.fleet.RayFleet`: the Ray instance, the
rank's placement group (one bundle per sampler), and the reaper of an instance the run started."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from typing import Any, Protocol

from fastlight.extras import import_extra
from fastlight.fleet.faults import SamplerError
from fastlight.procs import children_ignore_stop_signals

#: The flag the fleet's own settings live under (errors name it).
SETTINGS = "--data.fleet.init_args"
#: What a missing Ray is reported as.
WHAT = "--data.fleet fastlight.fleet.ray.fleet.RayFleet"


#: How long the trainer waits for a cluster's head to accept a connection before giving up on it (s).
REACH_TIMEOUT_S = 10.0


def check_reachable(address: str) -> None:
    """Refuse in one line a ``host:port`` (or ``ray://host:port``) where nothing accepts a connection:
    ``ray.init`` would retry it for minutes, logging a warning every few seconds. ``auto`` and other
    forms are Ray's to resolve."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as e:
        raise ConnectionError(
            f"{SETTINGS}.address {address}: nothing accepts connections there ({e.strerror or e}); start the "
            "cluster's head with `ray start --head --port PORT`, or give its address"
        ) from None


#: How long the trainer waits for a cluster's GCS to answer the authentication probe (s).
PROBE_TIMEOUT_S = 5.0
#: What a cluster with token authentication asks of the trainer.
TOKEN_NEEDED = (
    "RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
)


def check_auth(address: str, *, allow_unauthenticated: bool) -> None:
    """Refuse in one line a cluster the trainer cannot authenticate to (``ray.init`` would retry it), and
    one with authentication disabled unless ``allow_unauthenticated``: its GCS is asked once without a
    token, then once with the trainer's. ``ray://`` and what Ray cannot resolve are Ray's to check."""
    import grpc
    from ray._private.services import canonicalize_bootstrap_address
    from ray._raylet import AuthenticationTokenLoader
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    try:
        gcs = None if address.startswith("ray://") else canonicalize_bootstrap_address(address)
    except Exception:
        return
    if gcs is None:
        return

    def refused(metadata: tuple) -> bool | None:
        """True: the GCS refused the call as unauthenticated, False: it answered, None: anything else."""
        with grpc.insecure_channel(gcs) as channel:
            try:
                gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                    gcs_service_pb2.GetClusterIdRequest(), timeout=PROBE_TIMEOUT_S, metadata=metadata
                )
            except grpc.RpcError as e:
                return True if e.code() == grpc.StatusCode.UNAUTHENTICATED else None
        return False

    at = f"{SETTINGS}.address {address}: the Ray cluster there"
    without_token = refused(())
    if without_token is False and not allow_unauthenticated:
        raise ConnectionError(
            f"{at} has authentication disabled (RAY_AUTH_MODE=disabled): anyone who reaches its ports can "
            f"run code on its nodes; start it with RAY_AUTH_MODE=token, or set {SETTINGS}."
            "allow_unauthenticated true to join it anyway"
        )
    if not without_token:
        return
    try:
        header = AuthenticationTokenLoader.instance().get_token_for_http_header(ignore_auth_mode=True)
    except Exception as e:  # RAY_AUTH_TOKEN_PATH names a file that cannot be read
        raise ConnectionError(f"{at} needs {TOKEN_NEEDED}; the token cannot be read: {e}") from None
    if not header:
        raise ConnectionError(f"{at} needs {TOKEN_NEEDED}; no token was found")
    if refused(tuple(header.items())):
        raise ConnectionError(
            f"{at} refuses this machine's token (InvalidAuthToken): it needs {TOKEN_NEEDED}"
        )
    # Ray sends the token only in token mode, which it turns on by itself only for `auto`.
    mode = os.environ.get("RAY_AUTH_MODE", "token" if address == "auto" else "unset")
    if mode.lower() != "token":
        raise ConnectionError(f"{at} needs {TOKEN_NEEDED}; RAY_AUTH_MODE is {mode}")


class PlacementSettings(Protocol):
    """What the cluster reads of :class:`~fastlight.fleet.ray.fleet.RayFleet` (its settings)."""

    address: str | None
    allow_unauthenticated: bool
    num_cpus_per_sampler: float
    placement_strategy: str
    placement_timeout_s: float

    def bundle(self) -> dict[str, float]: ...


class RayCluster:
    """Ray for one trainer rank: :meth:`connect` joins (or starts) it and places the rank's bundles,
    :meth:`close` gives them back and shuts down an instance it started."""

    def __init__(self, settings: PlacementSettings, *, rank: int, samplers: int) -> None:
        self.settings, self.rank, self.samplers = settings, rank, samplers
        self.ray: Any = None
        self.pg: Any = None  # the rank's placement group: bundle i is sampler i's
        self._owns_ray = False
        self._reaper: subprocess.Popen | None = None

    def connect(self) -> Any:
        """Ray, initialised, with the rank's placement group placed; raises :class:`SamplerError`
        naming what cannot be placed within ``placement_timeout_s``."""
        ray = self.ray = import_extra("ray", extra="ray", what=WHAT)
        if not ray.is_initialized():
            self._init_ray(ray)
        from ray.util.placement_group import placement_group

        bundles = [self.settings.bundle() for _ in range(self.samplers)]
        name = f"fastlight-rank{self.rank}-{os.getpid()}"
        self.pg = placement_group(bundles, strategy=self.settings.placement_strategy, name=name)
        ready, _ = ray.wait([self.pg.ready()], timeout=self.settings.placement_timeout_s)
        if not ready:
            message = self.unplaceable(f"{self.samplers} samplers")
            self.close()
            raise SamplerError(message)
        return ray

    def _init_ray(self, ray: Any) -> None:
        address = self.settings.address
        kwargs: dict[str, Any] = {"logging_level": logging.WARNING}
        if address is None:
            # A new instance for this run, sized for the samplers (beyond the cores they share them).
            cpus = max(os.cpu_count() or 1, math.ceil(self.samplers * self.settings.num_cpus_per_sampler))
            kwargs |= {"address": "local", "num_cpus": cpus, "include_dashboard": False}
        else:
            check_reachable(address)
            check_auth(address, allow_unauthenticated=self.settings.allow_unauthenticated)
            kwargs["address"] = address
        # ray.init replaces the trainer's SIGTERM handler (its preemption checkpoint): put it back. The
        # Ray processes it starts ignore the stop signals: the trainer stops them itself.
        main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if main else None
        try:
            with children_ignore_stop_signals(), warnings.catch_warnings():
                # Ray Client's own advice on a failed ray:// join; the line below says it for fastlight
                warnings.filterwarnings("ignore", "Ray Client connection timed out", UserWarning)
                ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ray.exceptions.RayError) as e:
            if address is None:
                raise
            # A setting, not a sampler fault: one line, not a traceback.
            why = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
            raise ConnectionError(
                f"{SETTINGS}.address {address}: cannot join the Ray cluster there ({type(e).__name__}: "
                f"{why}); a cluster with token authentication (Ray's default) needs RAY_AUTH_MODE=token and "
                "its token here (RAY_AUTH_TOKEN or ~/.ray/auth_token)"
            ) from None
        finally:
            if main and sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)
        self._owns_ray = True
        shorten_raylet_messages(ray)
        if address is None:
            self._reaper = start_reaper(ray)

    def unplaceable(self, what: str) -> str:
        """Why ``what`` cannot be placed: the bundle each needs, and what the cluster has."""
        bundle = self.settings.bundle()
        try:
            total = self.ray.cluster_resources()
        except Exception:
            total = {}
        missing = sorted(k for k in bundle if k not in total)
        has = "{" + ", ".join(f"{k}: {total.get(k, 0):g}" for k in bundle) + "} in all"
        why = f"no node advertises {missing}" if missing else f"the cluster has {has}"
        return (
            f"{what} cannot be placed within {SETTINGS}.placement_timeout_s "
            f"{self.settings.placement_timeout_s:g} (each needs {bundle}; {why}); "
            "`ray status` lists the nodes and their resources"
        )

    def dead_node(self, node_id: str, ip: str) -> tuple[str, str] | None:
        """``(node id, IP)`` if node ``node_id`` left the cluster (dead, or no longer listed), else None."""
        for n in self.ray.nodes():
            if n.get("NodeID") == node_id:
                return None if n.get("Alive") else (node_id, str(n.get("NodeManagerAddress", ip)))
        return node_id, ip

    def close(self) -> None:
        """Remove the placement group; shut down an instance this rank started. Idempotent."""
        if self.pg is not None:
            with contextlib.suppress(Exception):
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(self.pg)
            self.pg = None
        if self._owns_ray:
            with contextlib.suppress(Exception):
                self.ray.shutdown()
            self._owns_ray = False
        if self._reaper is not None:  # what ray.shutdown left (agents still exiting) goes now
            self._reaper.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._reaper.wait(timeout=10.0)
            self._reaper = None
        self.ray = None


def offered(ray: Any, asked: dict[str, float]) -> str:
    """What each live node has free of the resources ``asked``, of its total: ``{CPU: 0 of 2, sim: 0 of 2}
    on node 3f2a9c1e (10.0.0.2)``, comma-separated."""
    try:
        from ray._private import state

        free, total = state.available_resources_per_node(), state.total_resources_per_node()
        ips = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes()}
    except Exception:
        return "(unknown)"
    has = {
        n: ", ".join(f"{k}: {free.get(n, {}).get(k, 0):g} of {t.get(k, 0):g}" for k in asked)
        for n, t in total.items()
    }
    return ", ".join(f"{{{h}}} on node {n[:8]} ({ips.get(n, '?')})" for n, h in has.items())


#: The end of the first line of Ray's message for a raylet that died, before its log's last lines.
LOG_TAIL = re.compile(r"Last \d+ lines of the Raylet logs:$")
#: The printers :func:`shorten_raylet_messages` installed in this process.
_SHORTENERS: set[Any] = set()


def shorten_raylet_messages(ray: Any) -> None:
    """Keep each ``(raylet) ...`` message Ray's GCS publishes to the driver to its first line, once a
    minute (a lost node brings the last 20 lines of its raylet's log per agent; the fleet names the node
    in one line). The whole messages stay in Ray's logs."""
    worker = ray._private.worker
    original = worker.print_to_stdstream
    if original in _SHORTENERS:  # installed already (a second fleet in this process)
        return
    said: dict[str, float] = {}

    def shortened(data: dict, ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            first = [m.strip().splitlines()[0].strip() for m in data.get("lines", []) if m.strip()]
            now = time.monotonic()
            lines = [line for line in first if line not in said or now - said[line] >= 60.0]
            said.update(dict.fromkeys(lines, now))
            data = {**data, "lines": [LOG_TAIL.sub("Its log: the node's raylet.out.", x) for x in lines]}
        if data.get("lines"):
            original(data, ignore_prefix)

    _SHORTENERS.add(shortened)
    worker.print_to_stdstream = shortened


#: The reaper's script (``python -c``, argv: the instance's process ids). Only noted pids with their start
#: time unchanged are killed: a pid the kernel reused belongs to someone else.
REAPER = r"""
import os, signal, sys, threading
roots, seen = {int(p) for p in sys.argv[1:]}, {}
def table():
    out = {}
    for e in os.listdir("/proc"):
        try:
            with open(f"/proc/{e}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(e)] = (int(fields[1]), fields[19])
        except (OSError, ValueError, IndexError):
            pass
    return out
def note():
    procs = table()
    frontier = {p for p in roots if p in procs}
    while frontier:
        for p in frontier:
            seen.setdefault(p, procs[p][1])
        frontier = {c for c, (parent, _) in procs.items() if parent in frontier and c not in seen}
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.buffer.read(), done.set()), daemon=True).start()
while not done.wait(1.0):
    note()
procs = table()
for pid, started in seen.items():
    if pid in procs and procs[pid][1] == started:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""


def start_reaper(ray: Any) -> subprocess.Popen | None:
    """Start :data:`REAPER` over the processes of the Ray instance this process just started (None where
    Ray does not say which): Ray's agents outlive a SIGKILLed driver by a minute, so the reaper SIGKILLs
    what still runs below the instance when its stdin closes (the trainer stopped the fleet, or died)."""
    try:
        node = ray._private.worker._global_node
        pids = [info.process.pid for infos in node.all_processes.values() for info in infos]
    except AttributeError:
        return None
    # Its own session: a Ctrl-C to the trainer's process group does not reach it.
    return subprocess.Popen(
        [sys.executable, "-c", REAPER, *map(str, pids)], stdin=subprocess.PIPE, start_new_session=True
    )
