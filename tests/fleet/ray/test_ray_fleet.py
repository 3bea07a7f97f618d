"""The Ray fleet: samplers as Ray actors of a two-node cluster on localhost, pinned to node 2.

One module-scoped cluster (``ray.cluster_utils.Cluster``: a head with 1 CPU and a node 2 that alone
advertises the custom resource ``sim``) serves the default-suite tests; the tests that remove nodes
or kill a trainer build their own and are ``slow``. Every cluster is shut down in its fixture's
teardown, and :func:`assert_no_ray_processes` checks by pid that none of its processes is left.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch
from jsonargparse import ArgumentParser

from benchmarks.checksums import weights_checksum
from fastlight.data.datamodule import RolloutDataModule
from fastlight.extras import MissingExtraError
from fastlight.fleet.base import FleetBuild, SamplerFleet
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.pool import LocalFleet, SamplerError, SamplerPool
from fastlight.fleet.ray.fleet import RayFleet, RaySamplerFleet
from fastlight.models.mlp import MLPActorCritic
from fastlight.modules.rl_module import RLModule
from fastlight.procs import alive
from fastlight.rollout import Rollout
from fastlight.weights.buckets import sync_entries
from tests.lightning_helpers import quiet_trainer

pytestmark = pytest.mark.multiproc
FIXED = "tests.fake_envs:FixedLength-v0"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ON_NODE_2 = {"sim": 1.0}


def ray_pids(cluster) -> list[int]:
    """Every process of ``cluster``'s nodes (gcs, raylets, agents, workers), by pid."""
    pids = []
    for node in [cluster.head_node, *cluster.worker_nodes]:
        for infos in node.all_processes.values():
            pids += [info.process.pid for info in infos]
    return [*pids, *(c for p in pids for c in _descendants(p))]


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except OSError:
            continue
        out += kids
        todo += kids
    return out


def assert_no_ray_processes(pids: list[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while [p for p in pids if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [p for p in pids if alive(p)]
    assert not left, f"Ray processes left: {[_cmd(p) for p in left]}"


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode()[:80]
        return f"{pid} {cmd}"
    except OSError:
        return str(pid)


def semaphore_inodes(pid: int) -> set[int]:
    """The inodes of the named POSIX semaphores (``/dev/shm/sem.*``: multiprocessing's Lock, Event,
    Semaphore ...) that process ``pid`` has mapped; by inode, since the mapping shows the name glibc
    created it under, not the ``sem.mp-*`` name it was linked to."""
    with open(f"/proc/{pid}/maps") as f:
        fields = [line.split(None, 5) for line in f]
    return {int(f[4]) for f in fields if len(f) == 6 and f[5].startswith("/dev/shm/sem.")}


def semaphore_files(inodes: set[int]) -> list[str]:
    """The ``/dev/shm/sem.*`` files that are one of ``inodes``."""
    out = []
    for entry in os.scandir("/dev/shm"):
        try:
            if entry.name.startswith("sem.") and entry.inode() in inodes:
                out.append(entry.path)
        except OSError:  # removed meanwhile (other processes' semaphores)
            continue
    return out


def start_cluster(nodes: list[dict]) -> tuple:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    added = [cluster.add_node(**kw) for kw in nodes]
    ray.init(address=cluster.address, logging_level="warning")
    cluster.wait_for_nodes()
    return cluster, added


def stop_cluster(cluster) -> None:
    import ray

    pids = ray_pids(cluster)
    ray.shutdown()
    cluster.shutdown()
    assert_no_ray_processes(pids)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple]:
    cluster, (node2,) = start_cluster([{"num_cpus": 2, "resources": {"sim": 2}}])
    try:
        yield cluster, node2.node_id
    finally:
        stop_cluster(cluster)


def alive_actors() -> list[str]:
    """The cluster's live actors (read from the GCS: the clusters here run no dashboard)."""
    from ray._private import state

    return [a["ActorID"] for a in state.actors().values() if a["State"] not in ("DEAD",)]


def policy_for(dm: RolloutDataModule) -> torch.nn.Module:
    return MLPActorCritic(dm.obs_dim, dm.action_dim)


def fleet_of(dm: RolloutDataModule, policy: torch.nn.Module) -> SamplerFleet:
    return dm.fleet.build(
        FleetBuild(dm.sampler_configs(0), policy, example_obs=dm.example_obs, faults=dm.faults)
    )


def sampler_nodes(fleet: RaySamplerFleet) -> list[str | None]:
    """The Ray node id each sampler runs on, by index (None until it answered), as the fleet's watch
    found it."""
    fleet.watch(force=True)
    return [None if a.where is None else a.where[0] for a in fleet.actors]


def sampler_pids(fleet: RaySamplerFleet, timeout: float = 60.0) -> list[int]:
    """The pid of each sampler's actor process (waits for them to start)."""
    import ray

    return [ray.get(a.info_ref, timeout=timeout)[2] for a in fleet.actors]


def items(fleet: SamplerFleet, n: int, timeout: float = 120.0) -> list[Rollout]:
    out, deadline = [], time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"{len(out)} of {n} rollouts in {timeout} s"
        r = fleet.next_item(0.5)
        if r is not None:
            out.append(r)
    return out


def version_of(r: Rollout) -> int:
    versions = r.policy_version[r.valid].unique().tolist()
    assert len(versions) == 1, versions
    return int(versions[0])


class RecordingModule(RLModule):
    """Records the behaviour version of every trained transition and where the samplers ran."""

    def on_train_start(self) -> None:
        self.seen: list[tuple[int, list[int]]] = []
        self.fleet = self.trainer.datamodule.pool

    def training_step(self, batch, batch_idx):
        self.seen.append((self.policy_version, batch.policy_version[batch.valid].unique().tolist()))
        if batch_idx == 0:
            self.nodes = sampler_nodes(self.fleet)
            if hasattr(self.fleet, "actors"):  # the Ray fleet: the semaphores its sampler actors hold
                self.semaphores = set().union(*(semaphore_inodes(a.where[2]) for a in self.fleet.actors))
            if self.fleet.inference is not None:
                self.inference_node = self.fleet.inference.where[0]
        return super().training_step(batch, batch_idx)


# ------------------------------------------------------------------ no cluster needed
def test_the_fleet_is_a_typed_setting_and_the_local_one_is_the_default():
    dm = RolloutDataModule(env_id=FIXED, num_envs=2, num_workers=1)
    assert isinstance(dm.fleet, LocalFleet) and dm.hparams.fleet == {
        "class_path": "fastlight.fleet.pool.LocalFleet",
        "init_args": {},
    }
    assert isinstance(fleet_of(dm, policy_for(dm)), SamplerPool)
    with pytest.raises(
        TypeError, match=r"^--data.fleet must be Fleet\(...\) \(fastlight.fleet.base\), got 'ray'"
    ):
        RolloutDataModule(env_id=FIXED, num_envs=2, num_workers=1, fleet="ray")

    class Misspelt(SamplerFleet):  # _recieve for _receive: refused when built, not mid-run
        def _start(self): ...
        def publish(self, policy, version): ...
        def request_drain(self): ...
        def _recieve(self, timeout): ...
        def _watch(self, now): ...
        def _describe(self): ...
        def set_task_weights(self, weights): ...
        def _stop(self): ...

    with pytest.raises(TypeError, match=r"abstract method '?_receive\b"):
        Misspelt([], None)


def test_the_cli_takes_the_ray_fleet_by_class_path():
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(RolloutDataModule, "data")
    args = [
        "--data.fleet.class_path", "fastlight.fleet.ray.fleet.RayFleet",
        "--data.fleet.init_args.address", "auto",
        "--data.fleet.init_args.sampler_resources", "{sim: 1}",
        "--data.fleet.init_args.allow_unauthenticated", "true",
    ]  # fmt: skip
    fleet = parser.instantiate(parser.parse_args(args)).data.fleet
    assert fleet == RayFleet(address="auto", sampler_resources={"sim": 1.0}, allow_unauthenticated=True)
    assert fleet.bundle() == {"CPU": 1.0, "sim": 1.0}
    with pytest.raises(Exception, match=r"RayFlet"):
        parser.parse_args(["--data.fleet.class_path", "fastlight.fleet.ray.fleet.RayFlet"])


def test_without_ray_the_ray_fleet_is_one_line_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m == "ray" else real(m, *a))
    with pytest.raises(MissingExtraError) as e:
        RayFleet(address="auto")
    assert str(e.value) == (
        "--data.fleet fastlight.fleet.ray.fleet.RayFleet needs the ray extra: "
        "pip install 'fastlight[ray]' (no module named 'ray')"
    )


@pytest.mark.parametrize(
    ("kwargs", "line"),
    [
        ({"num_cpus_per_sampler": 0}, "--data.fleet.init_args.num_cpus_per_sampler must be > 0, got 0"),
        ({"sampler_resources": {"sim": 0}}, "--data.fleet.init_args.sampler_resources must map custom"),
        ({"sampler_resources": {"CPU": 2}}, "--data.fleet.init_args.sampler_resources must map custom"),
        ({"placement_strategy": "SPRED"}, "--data.fleet.init_args.placement_strategy must be one of PACK"),
        ({"placement_timeout_s": 0}, "--data.fleet.init_args.placement_timeout_s must be > 0, got 0"),
    ],
)
def test_bad_ray_fleet_settings_are_one_line(kwargs, line):
    with pytest.raises(ValueError) as e:
        RayFleet(**kwargs)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("kwargs", "line"),
    [
        ({"num_cpus_inference": 0}, "--data.fleet.init_args.num_cpus_inference must be > 0, got 0"),
        ({"inference_resources": {"CPU": 1}}, "--data.fleet.init_args.inference_resources must map GPU or"),
        ({"inference_resources": {"GPU": 0}}, "--data.fleet.init_args.inference_resources must map GPU or"),
    ],
)
def test_bad_inference_actor_settings_are_one_line(kwargs, line):
    with pytest.raises(ValueError) as e:
        RayFleet(**kwargs)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


# ------------------------------------------------------------------ on the two-node cluster
def test_a_fit_samples_on_node_2_strictly_on_policy_and_leaves_no_actor(cluster):
    _, node2 = cluster
    dm = RolloutDataModule(
        env_id=FIXED, env_kwargs={"lengths": (3, 6, 2)}, num_envs=4, num_workers=2, cycles_per_step=2,
        fleet=RayFleet(sampler_resources=ON_NODE_2), faults=FaultSettings(verify_weights_every=1),
    )  # fmt: skip
    model = RecordingModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=2)
    quiet_trainer(max_steps=8).fit(model, datamodule=dm)
    assert model.policy_version == 4 and model.global_step == 8
    assert dm.delivery.verified == 2 * 4  # both actors' copies held every version's weights (object store)
    assert model.seen == [(v, [v]) for v in range(4)]  # max_staleness 0: every round on the current version
    assert model.nodes == [node2, node2]  # the custom resource put both samplers on node 2
    assert dm.fault_counters() == {"faults/worker_restarts": 0.0, "faults/dropped_rollouts": 0.0}
    assert dm.pool is None and alive_actors() == []
    # No multiprocessing semaphore in a sampler actor: one left /dev/shm/sem.mp-* behind per actor (their
    # task-weights lock), since a killed actor neither exits nor has its resource tracker clean up.
    assert model.semaphores == set()
    assert semaphore_files(model.semaphores) == []
    from ray.util import placement_group_table

    assert {pg["state"] for pg in placement_group_table().values()} <= {"REMOVED"}


class ServedModule(RecordingModule):
    """Also checks, at each batch, that the inference actor serves exactly the weights just published."""

    def training_step(self, batch, batch_idx):
        import ray

        # The actor's own weights, read inside it (Ray's __ray_call__ runs a function on the actor).
        served = self.fleet.inference.handle.__ray_call__.remote(lambda actor: weights_checksum(actor.policy))
        self.same_weights = getattr(self, "same_weights", []) + [
            ray.get(served) == weights_checksum(self.policy)
        ]
        return super().training_step(batch, batch_idx)


def test_an_inference_actor_on_node_2_serves_the_samplers_with_every_version(cluster):
    """--data.inference with the Ray fleet: one inference actor (placed on node 2 by its resource)
    serves both sampler actors; its weights come over a gloo group from the trainer (bucketed)."""
    from fastlight.inference import InferenceSettings

    _, node2 = cluster
    half = {"sim": 0.5}  # node 2 (2 CPUs, sim 2) holds the two samplers and the inference actor
    fleet = RayFleet(sampler_resources=half, num_cpus_per_sampler=0.5, inference_resources=half,
                     num_cpus_inference=0.5)  # fmt: skip
    dm = RolloutDataModule(
        env_id=FIXED, env_kwargs={"lengths": (3, 6, 2)}, num_envs=4, num_workers=2, cycles_per_step=2,
        inference=InferenceSettings(max_wait_ms=1.0), fleet=fleet,
        faults=FaultSettings(verify_weights_every=1),
    )  # fmt: skip
    model = ServedModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=2)
    quiet_trainer(max_steps=8).fit(model, datamodule=dm)
    assert model.policy_version == 4
    assert dm.delivery.verified == 4  # the actor's answers carried every version's delivery checksum
    assert model.seen == [(v, [v]) for v in range(4)]  # every step served by the version just published
    assert model.same_weights == [True] * 4  # bit for bit the trainer's weights at each batch
    assert model.nodes == [node2, node2] and model.inference_node == node2
    assert dm.last_sync.mode == "bucketed" and dm.last_sync.version == 3
    assert dm.pool is None and alive_actors() == []


def test_an_inference_actor_no_node_has_room_for_stops_the_fit_in_one_line_blaming_no_sampler(cluster, capfd):
    """The samplers' bundles take node 2's CPUs and all its `sim`; the inference actor also asks `sim`:
    no node can take it. The fit stops within placement_timeout_s, naming what it asks and what each
    node has free; no sampler actor is started (they would wait on it, and be restarted as hung)."""
    from ray.util import placement_group_table

    from fastlight.inference import InferenceSettings

    fleet = RayFleet(sampler_resources={"sim": 1.0}, inference_resources={"sim": 0.5}, placement_timeout_s=3)
    dm = RolloutDataModule(env_id=FIXED, env_kwargs={"lengths": (4,)}, num_envs=2, num_workers=2,
                           inference=InferenceSettings(), fleet=fleet)  # fmt: skip
    model = RecordingModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=2)
    capfd.readouterr()
    t0 = time.monotonic()
    with pytest.raises(SamplerError) as e:
        quiet_trainer(max_steps=2).fit(model, datamodule=dm)
    took = time.monotonic() - t0
    line, err = str(e.value), capfd.readouterr().err
    assert "\n" not in line and took < 30, (took, line)  # 3 s of waiting, and the fit's own start
    assert line.startswith(
        "the inference worker (Ray actor, rank 0) cannot be placed within "
        "--data.fleet.init_args.placement_timeout_s 3: it asks {'CPU': 1.0, 'sim': 0.5}, and the nodes have "
        "free {CPU: "
    ), line
    assert re.search(r"\{CPU: 0 of 2, sim: 0 of 2\} on node \w{8} \(", line), line  # node 2, all reserved
    assert re.search(r"\{CPU: 1 of 1, sim: 0 of 0\} on node \w{8} \(", line), line  # the head: no `sim`
    assert "sampler" not in err.replace("the rank's samplers", ""), err[-3000:]  # none started, none blamed
    assert alive_actors() == []
    assert {pg["state"] for pg in placement_group_table().values()} <= {"REMOVED"}


@pytest.mark.slow
def test_a_sigkilled_inference_actor_stops_the_run_naming_it(cluster):
    import ray

    from fastlight.inference import InferenceSettings

    _, node2 = cluster
    half = {"sim": 0.5}
    fleet = RayFleet(sampler_resources=half, num_cpus_per_sampler=0.5, inference_resources=half,
                     num_cpus_inference=0.5)  # fmt: skip
    dm = RolloutDataModule(env_id=FIXED, env_kwargs={"lengths": (4,)}, num_envs=2, num_workers=2,
                           max_staleness=100, inference=InferenceSettings(), fleet=fleet)  # fmt: skip
    policy = policy_for(dm)
    pool = dm.fleet.build(
        FleetBuild(
            dm.sampler_configs(0),
            policy,
            inference=dm.inference,
            example_obs=dm.example_obs,
            faults=dm.faults,
        )
    )
    pool.start()
    try:
        assert pool.publish(policy, 0).mode == "bucketed"
        assert {version_of(r) for r in items(pool, 2)} == {0}
        node, _, pid = ray.get(pool.inference.info_ref)
        assert node == node2
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(SamplerError) as e:
            items(pool, 100)
        assert time.monotonic() - t0 < 30
        assert str(e.value).startswith(f"inference worker (Ray actor, pid {pid}, Ray node {node2} ")
        assert "died" in str(e.value) and "does not restart it" in str(e.value)
    finally:
        pool.stop()
    assert alive_actors() == []


@pytest.mark.slow
def test_a_stopped_sampler_actor_is_caught_by_its_heartbeat_and_restarted(cluster, capfd):
    """SIGSTOP: the actor answers no more, so its beat count (held in a Liveness, as a local
    sampler's) stands still; past heartbeat_s it is killed and restarted, named as a local one."""
    _, node2 = cluster
    dm = RolloutDataModule(
        env_id=FIXED, env_kwargs={"lengths": (4,)}, num_envs=2, num_workers=2, max_staleness=100,
        faults=FaultSettings(heartbeat_s=3.0), fleet=RayFleet(sampler_resources=ON_NODE_2),
    )  # fmt: skip
    policy = policy_for(dm)
    fleet = fleet_of(dm, policy)
    fleet.start()
    stopped = None
    try:
        fleet.publish(policy, 0)
        items(fleet, 2)
        stopped = sampler_pids(fleet)[0]
        capfd.readouterr()
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.monotonic()
        while fleet.restarts == 0:
            assert time.monotonic() - t0 < 30, "no restart within 30 s of the SIGSTOP"
            fleet.next_item(0.5)
        assert 3.0 <= time.monotonic() - t0 < 3.0 + 10.0
        assert (fleet.restarts, fleet.dropped_rollouts) == (1, 1)
        said = capfd.readouterr().err
        assert re.search(
            rf"fastlight: sampler 0 \(Ray actor, pid {stopped}, Ray node {node2} \([^)]*\), env "
            rf"{re.escape(FIXED)}\) made no progress for \d+\.\d s \(--data.faults.heartbeat_s 3\); "
            r"killed it; restarting it",
            said,
        ), said
        assert sampler_pids(fleet)[0] != stopped and len(items(fleet, 2)) == 2
    finally:
        fleet.stop()
        if stopped is not None and alive(stopped):  # Ray killed it; never leave a stopped process
            os.kill(stopped, signal.SIGKILL)
    assert alive_actors() == []


@pytest.mark.slow
def test_an_env_that_raises_once_in_a_sampler_actor_is_restarted_and_the_fit_goes_on(
    cluster, tmp_path, capfd
):
    """A flaky simulator on a Ray node: its actor is restarted within the budget, named in one line."""
    env_kwargs = {"bad_instance": 1, "bad_step": 2, "flag_dir": str(tmp_path), "lengths": (4,)}
    dm = RolloutDataModule(
        env_id="tests.sampling.error_envs:Flaky-v0", env_kwargs=env_kwargs, num_envs=4, num_workers=2,
        fleet=RayFleet(sampler_resources=ON_NODE_2),
    )  # fmt: skip
    model = RecordingModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=2)
    quiet_trainer(max_steps=6).fit(model, datamodule=dm)
    assert (tmp_path / "raised").exists() and model.policy_version == 3
    assert dm.fault_counters()["faults/worker_restarts"] == 1.0
    said = capfd.readouterr().err
    assert re.search(
        r"fastlight: sampler \d \(Ray actor, [^;]*\) crashed: EnvError: env Flaky-v0 \(index 1 of this "
        r"sampler, seed \d+\) raised RuntimeError at episode step 2: the simulator lost its road network; "
        r"restarting it",
        said,
    ), said
    assert alive_actors() == []


@pytest.mark.slow
def test_a_sigkilled_sampler_actor_is_restarted_then_the_budget_stops_the_run(cluster):
    _, node2 = cluster
    dm = RolloutDataModule(
        env_id=FIXED, env_kwargs={"lengths": (4,)}, num_envs=2, num_workers=2, max_staleness=100,
        faults=FaultSettings(max_worker_restarts=1), fleet=RayFleet(sampler_resources=ON_NODE_2),
    )  # fmt: skip
    policy = policy_for(dm)
    fleet = fleet_of(dm, policy)
    assert isinstance(fleet, RaySamplerFleet)
    fleet.start()
    try:
        stats = fleet.publish(policy, 0)
        floats = sum(v.numel() for _, v in sync_entries(policy))
        assert (stats.version, stats.mode, stats.bytes) == (0, "ray_object_store", 4 * floats)
        assert {version_of(r) for r in items(fleet, 2)} == {0}
        first = sampler_pids(fleet)
        os.kill(first[0], signal.SIGKILL)
        fleet.publish(policy, 1)
        deadline = time.monotonic() + 60
        while fleet.restarts == 0:
            assert time.monotonic() < deadline, "no restart within 60 s of the SIGKILL"
            fleet.next_item(0.5)
        assert (fleet.restarts, fleet.dropped_rollouts) == (1, 1)
        # The new actor starts on the current weights, on node 2 again.
        assert max(version_of(r) for r in items(fleet, 4)) == 1
        second = sampler_pids(fleet)
        assert second[0] != first[0] and second[1] == first[1] and sampler_nodes(fleet) == [node2, node2]
        os.kill(second[1], signal.SIGKILL)
        with pytest.raises(SamplerError) as e:
            items(fleet, 100)
        assert str(e.value).startswith(f"sampler 1 (Ray actor, pid {second[1]}, Ray node {node2} ")
        assert "restart budget exhausted: 1 restarts in the last 600 s" in str(e.value)
    finally:
        fleet.stop()
    assert alive_actors() == []


# ------------------------------------------------------------------ slow: trainers killed, nodes removed
TRAINER = """
import os, sys, time
import lightning as L
from fastlight.data.datamodule import RolloutDataModule
from fastlight.modules.rl_module import RLModule
from fastlight.fleet.ray.fleet import RayFleet

class Report(L.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == 1:
            fleet = trainer.datamodule.pool
            import ray
            node = ray._private.worker._global_node
            own = [i.process.pid for infos in node.all_processes.values() for i in infos] if node else []
            reaper = [fleet._cluster._reaper.pid] if fleet._cluster._reaper is not None else []
            samplers = [ray.get(a.info_ref, timeout=60)[2] for a in fleet.actors]
            print("PIDS", *samplers, "|", *own, "|", *reaper, flush=True)
        time.sleep(0.2)

address = sys.argv[1] if sys.argv[1] != "none" else None
resources = None if address is None else {"sim": 1.0}
# The test's cluster (ray.cluster_utils) runs without authentication: joined on purpose.
fleet = RayFleet(address=address, sampler_resources=resources, allow_unauthenticated=True)
dm = RolloutDataModule(env_id="tests.fake_envs:FixedLength-v0", env_kwargs={"lengths": (4,)}, num_envs=2,
                       num_workers=2, fleet=fleet)
L.Trainer(max_steps=10_000, logger=False, enable_checkpointing=False, enable_progress_bar=False,
          callbacks=[Report()]).fit(RLModule(obs_dim=3, action_dim=2), datamodule=dm)
"""


def run_trainer_until_pids(address: str) -> tuple[subprocess.Popen, list[int], list[int], list[int]]:
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, address], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("PIDS"):
            actors, own, reaper = (list(map(int, part.split())) for part in line[4:].split("|"))
            return proc, actors, own, reaper
    proc.wait()
    raise AssertionError("".join(lines[-40:]))


@pytest.mark.slow
def test_a_sigkilled_trainer_leaves_no_ray_process_of_the_instance_it_started():
    from benchmarks.procfs import descendants

    proc, actors, own, reaper = run_trainer_until_pids("none")
    try:
        assert len(actors) == 2 and own and len(reaper) == 1
        everything = sorted({*actors, *own, *(c for p in own for c in descendants(p))})
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        t0 = time.monotonic()
        assert_no_ray_processes(everything + reaper, timeout=30)
        print(f"all {len(everything)} Ray processes gone {time.monotonic() - t0:.1f} s after the SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_a_lost_node_moves_its_samplers_then_stops_the_run_and_a_killed_trainer_leaves_the_cluster_up(
    cluster,
):
    import ray

    cluster, _ = cluster
    # Two more nodes, the only ones with the resource `spare`: the test removes them both.
    node2, node3 = (cluster.add_node(num_cpus=2, resources={"spare": 2}) for _ in range(2))
    cluster.wait_for_nodes()
    try:
        # A trainer that joined this cluster is SIGKILLed: its actors go, the cluster stays.
        proc, actors, _, reaper = run_trainer_until_pids(cluster.address)
        assert reaper == []  # it started no Ray instance
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert_no_ray_processes(actors, timeout=60)
        assert [n["Alive"] for n in ray.nodes()] == [True] * 4

        dm = RolloutDataModule(
            env_id=FIXED, env_kwargs={"lengths": (4,)}, num_envs=2, num_workers=2, max_staleness=100,
            fleet=RayFleet(sampler_resources={"spare": 1}, placement_strategy="SPREAD"),
        )  # fmt: skip
        policy = policy_for(dm)
        fleet = fleet_of(dm, policy)
        fleet.start()
        try:
            fleet.publish(policy, 0)
            items(fleet, 2)
            sampler_pids(fleet)  # both have answered where they run
            nodes = sampler_nodes(fleet)
            assert set(nodes) == {node2.node_id, node3.node_id}  # SPREAD: one on each
            first = nodes[0]
            gone, stays = (node2, node3) if first == node2.node_id else (node3, node2)
            cluster.remove_node(gone)
            t0 = time.monotonic()
            while fleet.restarts == 0:
                assert time.monotonic() - t0 < 60, "the lost node was not noticed within 60 s"
                fleet.next_item(0.5)
            noticed = time.monotonic() - t0
            items(fleet, 4)
            sampler_pids(fleet)
            assert sampler_nodes(fleet) == [stays.node_id, stays.node_id]
            assert (fleet.restarts, fleet.dropped_rollouts) == (1, 1)
            cluster.remove_node(stays)
            t0 = time.monotonic()
            with pytest.raises(SamplerError) as e:
                items(fleet, 1000, timeout=120)
            stopped = time.monotonic() - t0
            assert str(e.value).startswith(f"Ray node {stays.node_id} (")
            assert "left the cluster with samplers [0, 1] of rank 0" in str(e.value)
            assert "no node advertises ['spare']" in str(e.value)
            assert stopped < 30 + noticed, (stopped, noticed)
            print(
                f"node loss noticed in {noticed:.1f} s; the run stopped {stopped:.1f} s after the last "
                "node left"
            )
        finally:
            fleet.stop()
    finally:
        for node in (node2, node3):
            if node in cluster.worker_nodes:
                cluster.remove_node(node)
