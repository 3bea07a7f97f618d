"""How the Ray fleet reads a node lost without a word, against a stand-in for Ray (no cluster): the
answers Ray gives, in the order it gives them when a raylet is SIGKILLed (issue 40 item 1).

Until Ray's health check declares the node dead its actors' calls fail with ``ActorUnavailableError``
and the node stays ``Alive`` in ``ray.nodes()``; then the calls fail with ``ActorDiedError`` and the
node is not ``Alive``. The fleet must restart nothing on the first (a replacement would land in the
same bundle, on the dead node), and on the second move every sampler of the node for one restart,
saying in one line which node left and where they went. The same on a real three-node cluster:
``tests/multinode/test_ray_lost_node.py``.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from fastlight.data.datamodule import RolloutDataModule
from fastlight.fleet.base import FleetBuild
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.ray.actors import NODE_VERDICT_S
from fastlight.fleet.ray.cluster import shorten_raylet_messages
from fastlight.fleet.ray.fleet import RayFleet, RaySamplerFleet
from fastlight.models.mlp import MLPActorCritic

ray = pytest.importorskip("ray")
NODE2, NODE3, IP = "n2" * 28, "n3" * 28, "10.0.0.2"


class FakeRay:
    """What the fleet calls of Ray once its cluster is connected: actors whose calls return refs,
    ``wait``/``get`` on them (an answer, or an exception set by the test), ``nodes``, ``kill``."""

    exceptions = ray.exceptions

    def __init__(self) -> None:
        self.answers: dict[object, Any] = {}
        self.alive = {NODE2: True, NODE3: True}
        self.actors: list[FakeActor] = []
        self.pids = itertools.count(100)

    def remote(self, cls: type) -> FakeActorClass:
        return FakeActorClass(self)

    def wait(self, refs: list[object], num_returns: int = 1, timeout: float | None = None) -> tuple:
        done = [r for r in refs if r in self.answers][:num_returns]
        return done, [r for r in refs if r not in done]

    def get(self, ref: object) -> Any:
        answer = self.answers[ref]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def nodes(self) -> list[dict]:
        return [{"NodeID": n, "Alive": alive, "NodeManagerAddress": IP} for n, alive in self.alive.items()]

    def kill(self, handle: FakeActor, no_restart: bool = True) -> None:
        handle.killed = True


class FakeActorClass:
    """``ray.remote(SamplerActor)``: ``.options(...).remote(...)`` makes a :class:`FakeActor`."""

    def __init__(self, fake: FakeRay) -> None:
        self.fake = fake

    def options(self, **kwargs: Any) -> FakeActorClass:
        return self

    def remote(self, *args: Any) -> FakeActor:
        self.fake.actors.append(FakeActor())
        return self.fake.actors[-1]


class FakeMethod:
    def __init__(self) -> None:
        self.refs: list[object] = []

    def remote(self, *args: Any) -> object:
        self.refs.append(object())
        return self.refs[-1]


class FakeActor:
    def __init__(self) -> None:
        self.info, self.next_rollout, self.set_weights = FakeMethod(), FakeMethod(), FakeMethod()
        self.killed = False


def fleet_on(fake: FakeRay, workers: int = 2, heartbeat_s: float = 60.0) -> RaySamplerFleet:
    """A started fleet of ``workers`` samplers on the stand-in, each having answered where it runs
    (node 2) and one heartbeat."""
    dm = RolloutDataModule(
        env_id="tests.fake_envs:FixedLength-v0", num_envs=2, num_workers=workers,
        faults=FaultSettings(heartbeat_s=heartbeat_s), fleet=RayFleet(sampler_resources={"sim": 1.0}),
    )  # fmt: skip
    policy = MLPActorCritic(dm.obs_dim, dm.action_dim)
    fleet = RaySamplerFleet(dm.fleet, FleetBuild(dm.sampler_configs(0), policy, faults=dm.faults))
    fleet._cluster.ray, fleet._cluster.pg = fake, "the rank's placement group"
    with fleet._lock:
        fleet.actors = [fleet._create(i) for i in range(workers)]
    for a in fake.actors:
        locate(fake, a, NODE2)
        fake.answers[a.next_rollout.refs[-1]] = (("wait", None, None), 1)
    read(fleet, workers)
    fleet.watch(force=True)
    assert [a.where[0] for a in fleet.actors] == [NODE2] * workers
    return fleet


def locate(fake: FakeRay, actor: FakeActor, node: str) -> None:
    """``actor`` answers ``info``: it runs on ``node``."""
    fake.answers[actor.info.refs[-1]] = (node, IP, next(fake.pids))


def read(fleet: RaySamplerFleet, answers: int) -> None:
    for _ in range(answers):
        assert fleet._receive(0.0) is None  # heartbeats and failures: never a Rollout here


def answer_all(fake: FakeRay, fleet: RaySamplerFleet, error: BaseException) -> None:
    """Every call in flight fails with ``error``; the fleet reads them all."""
    for ref in list(fleet.pending):
        fake.answers[ref] = error
    read(fleet, len(fleet.pending))


def test_an_unreachable_node_restarts_nothing_then_its_death_moves_its_samplers_for_one_restart(capfd):
    fake = FakeRay()
    fleet = fleet_on(fake)
    first = list(fake.actors)
    calls = [len(a.next_rollout.refs) for a in first]
    capfd.readouterr()

    # The raylet is gone, Ray does not know yet: calls fail as unavailable, every ~2 s, for ~15 s.
    unavailable = ray.exceptions.ActorUnavailableError("RpcError: Socket closed", None)
    for _ in range(3):
        answer_all(fake, fleet, unavailable)
        fleet.watch(force=True)
    assert (fleet.restarts, len(fake.actors)) == (0, 2)  # nothing restarted, nothing placed anew
    assert [len(a.next_rollout.refs) for a in first] == [n + 3 for n in calls]  # each call made again
    assert capfd.readouterr().err == ""

    # Ray declares the node dead: it is no longer Alive, the calls fail as deaths.
    fake.alive[NODE2] = False
    answer_all(fake, fleet, ray.exceptions.ActorDiedError())
    assert (fleet.restarts, fleet.dropped_rollouts, len(fake.actors)) == (1, 2, 4)
    assert all(a.killed for a in first)
    (restart,) = capfd.readouterr().err.splitlines()
    assert restart.startswith(
        f"fastlight: Ray node {NODE2} ({IP}) left the cluster, and with it samplers 0, 1"
    )
    assert restart.endswith("(1 of 3 restarts in 600 s)")

    # Both replacements run on node 3: one line says so, once both answered (no "runs on" lines).
    locate(fake, fake.actors[2], NODE3)
    fleet.watch(force=True)
    assert capfd.readouterr().err == ""
    locate(fake, fake.actors[3], NODE3)
    fleet.watch(force=True)
    (moved,) = capfd.readouterr().err.splitlines()
    assert moved == (
        f"fastlight: Ray node {NODE2} ({IP}) left the cluster; its samplers 0, 1 of rank 0 now run on "
        f"Ray node {NODE3} ({IP}) (samplers 0, 1; pids 102, 103)"
    )
    fleet.watch(force=True)
    assert capfd.readouterr().err == ""  # said once


def test_an_actor_unreachable_for_longer_than_ray_takes_to_judge_its_node_is_judged_by_its_beats(capfd):
    fake = FakeRay()
    fleet = fleet_on(fake, workers=1, heartbeat_s=1.0)
    capfd.readouterr()
    answer_all(fake, fleet, ray.exceptions.ActorUnavailableError("RpcError: Socket closed", None))
    now = time.monotonic()
    with fleet._lock:
        fleet._watch(now + 5.0)  # silent past heartbeat_s, but Ray may still be judging its node
        assert fleet.restarts == 0
        fleet._watch(now + NODE_VERDICT_S + 5.0)  # Ray would have declared a dead node by now
    assert fleet.restarts == 1 and len(fake.actors) == 2
    assert "fastlight: sampler 0 (Ray actor, pid 100, Ray node" in capfd.readouterr().err


def test_rays_messages_on_a_lost_node_are_one_line_each_once(monkeypatch, capsys):
    """What Ray's GCS publishes to the driver when a raylet is SIGKILLed (the messages as Ray 2.60 words
    them): its log's last 20 lines, once per agent that watched it, then its node marked dead."""
    from ray._private import worker

    monkeypatch.setattr(worker, "print_to_stdstream", worker.print_to_stdstream)  # put back after the test
    shorten_raylet_messages(ray)
    shorten_raylet_messages(ray)  # once: a second fleet of the process does not wrap it again
    died = (
        "Raylet is terminated. Termination is unexpected. Possible reasons include: (1) SIGKILL by the user "
        "or system OOM killer, (2) Invalid memory access from Raylet causing SIGSEGV or SIGBUS, (3) Other "
        "termination signals. Last 20 lines of the Raylet logs:\n"
        + "    [state-dump] NodeManager.deadline_timer.flush_free_objects - 1 total (1 active)\n"
        * 20
    )
    dead = (
        f"The node with node id: {NODE2} and address: {IP} and node name: {IP} has been marked dead because "
        "the detector has missed too many heartbeats from it. This can happen when a (1) raylet crashes "
        "unexpectedly (OOM, etc.) \n\t(2) raylet has lagging heartbeats due to slow network or busy workload."
    )
    for message in (died, died, dead):
        worker.print_to_stdstream({"lines": [message], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    worker.print_to_stdstream(
        {"lines": ["an env's own line"], "pid": 4321, "is_err": False}, ignore_prefix=False
    )
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "state-dump" not in "".join(out), out
    assert out[0].endswith("(3) Other termination signals. Its log: the node's raylet.out."), out
    assert out[1].endswith("This can happen when a (1) raylet crashes unexpectedly (OOM, etc.)"), out
    assert out[2].endswith("an env's own line") and "pid=4321" in out[2], out  # a worker's lines: as they are
