"""Local fleet vs Ray fleet: env steps/s and data wait per update, same samplers and envs, interleaved.

    python -m benchmarks.fleet --trials 3 --updates 30                       # highway-fast-v0
    python -m benchmarks.fleet --env-id tests.fake_envs:Fault-v0 \\
        --env-kwargs '{"step_sleep": 0.002, "length": 40}' --workers 1 2 4 8 16 # sleep env: scaling

Each trial drives a :class:`~fastlight.data.datamodule.RolloutDataModule` as a trainer does, without
the training itself: publish version ``v``, take the next super-batch through the prefetcher
(``perf/data_wait_ms``), ``v += 1``, sleep ``--update-s`` (the update's cost), strictly on-policy
(``max_staleness 0``). The first ``--warmup`` updates (start-up, imports) are not timed. Env steps
are the Rollouts' valid steps (a DPSA dummy step calls no simulator). Trials alternate between the
fleets, so both see the same machine state. The Ray fleet joins one local Ray instance started once
for the run (its start-up is not a per-trial cost), ``num_cpus`` = the largest sampler count.

``--consumer`` measures the trainer's own ceiling: the same loop over a Rollout made once, no samplers.

``--ray-nodes K`` (K > 1) runs the Ray fleet on a K-node cluster on this machine
(``ray.cluster_utils.Cluster``: a head with no CPUs, where this process is the trainer, and K nodes
of ``ceil(max samplers / K)`` CPUs each), samplers spread over them (``placement_strategy SPREAD``):

    python -m benchmarks.fleet --fleets ray --ray-nodes 4 --workers 4 8 16 --consumer \
        --env-id tests.fake_envs:Fault-v0 --env-kwargs '{"step_sleep": 0.01, "length": 40}'
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from types import SimpleNamespace
from typing import Any

from fastlight.data.datamodule import RolloutDataModule
from fastlight.data.prefetch import Prefetcher
from fastlight.fleet.pool import LocalFleet
from fastlight.fleet.ray.fleet import RayFleet
from fastlight.models.mlp import MLPActorCritic
from fastlight.rollout import Rollout


def trial(fleet: Any, args: argparse.Namespace, workers: int) -> dict[str, float]:
    dm = RolloutDataModule(
        env_id=args.env_id, env_kwargs=json.loads(args.env_kwargs), num_envs=workers * args.envs_per_worker,
        num_workers=workers, max_horizon=args.max_horizon, fleet=fleet, start_method="spawn", seed=0,
        rank_rounds="apart",  # the same sampling on both fleets (Ray cannot end rounds together)
    )  # fmt: skip
    module = SimpleNamespace(policy=MLPActorCritic(dm.obs_dim, dm.action_dim, continuous=dm.continuous),
                             policy_version=0)  # fmt: skip
    dm.start(module)
    steps, waits, t0 = 0, [], 0.0
    try:
        for u in range(args.warmup + args.updates):
            if u == args.warmup:
                t0 = time.perf_counter()
            dm.publish(module)
            r = dm.prefetcher.get(timeout=600)
            if u >= args.warmup:
                steps += r.stats.valid_steps
                waits.append(1000 * r.stats.data_wait_s)
            module.policy_version += 1
            time.sleep(args.update_s)
        wall = time.perf_counter() - t0
    finally:
        dm.stop()
    return {"env_steps_per_s": steps / wall, "data_wait_ms": statistics.mean(waits), "wall_s": wall}


def consumer(args: argparse.Namespace, workers: int) -> dict[str, float]:
    """The trainer's own ceiling: the trial's loop (take a super-batch through the prefetcher,
    version + 1, ``--update-s``) over ``workers`` Rollouts sampled once and handed over again and
    again, no sampler running: what the trainer side can consume, whatever the fleet."""
    dm = RolloutDataModule(
        env_id=args.env_id, env_kwargs=json.loads(args.env_kwargs), num_envs=workers * args.envs_per_worker,
        num_workers=workers, max_horizon=args.max_horizon, start_method="spawn", seed=0,
    )  # fmt: skip
    module = SimpleNamespace(policy=MLPActorCritic(dm.obs_dim, dm.action_dim, continuous=dm.continuous),
                             policy_version=0)  # fmt: skip
    dm.start(module)
    dm.prefetcher.stop()  # the items are taken here, below
    dm.publish(module)
    items: list[Rollout] = []
    try:
        while len(items) < workers:
            item = dm.pool.next_item(1.0)
            if item is not None:
                items.append(item)
    finally:
        dm.stop()
    turn = iter(range(1 << 62))
    version = [0]
    prefetcher = Prefetcher(
        lambda timeout: items[next(turn) % workers], lambda: version[0],
        items_per_batch=workers, max_staleness=1 << 30, depth=2,
    ).start()  # fmt: skip
    steps, t0 = 0, 0.0
    try:
        for u in range(args.warmup + args.updates):
            if u == args.warmup:
                t0 = time.perf_counter()
            r = prefetcher.get(timeout=600)
            if u >= args.warmup:
                steps += r.stats.valid_steps
            version[0] += 1
            time.sleep(args.update_s)
        wall = time.perf_counter() - t0
    finally:
        prefetcher.stop()
    return {"env_steps_per_s": steps / wall, "data_wait_ms": 0.0, "wall_s": wall}


def start_nodes(nodes: int, workers: int) -> tuple[Any, str]:
    """A ``nodes``-node Ray cluster on this machine and its address (see the module docstring)."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(nodes):
        cluster.add_node(num_cpus=math.ceil(workers / nodes))
    ray.init(address=cluster.address, logging_level="warning")
    cluster.wait_for_nodes()
    return cluster, cluster.address


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", default="highway-fast-v0")
    p.add_argument("--env-kwargs", default="{}")
    p.add_argument("--workers", type=int, nargs="+", default=[2])
    p.add_argument("--envs-per-worker", type=int, default=2)
    p.add_argument("--max-horizon", type=int, default=40)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--update-s", type=float, default=0.0)
    p.add_argument("--fleets", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    p.add_argument("--ray-nodes", type=int, default=1, help="Ray nodes on this machine (see above)")
    p.add_argument("--consumer", action="store_true", help="also measure the trainer's own ceiling")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.ray_nodes < 1:
        p.error(f"--ray-nodes must be >= 1, got {args.ray_nodes}")
    cluster = None
    fleets: dict[str, Any] = {"local": LocalFleet(), "ray": RayFleet()}
    if "ray" in args.fleets:
        import ray

        if args.ray_nodes > 1:
            cluster, address = start_nodes(args.ray_nodes, max(args.workers))
            fleets["ray"] = RayFleet(address=address, placement_strategy="SPREAD")
        else:
            ray.init(
                address="local", num_cpus=max(args.workers), include_dashboard=False, logging_level="warning"
            )
    names = [*args.fleets, *(["consumer"] if args.consumer else [])]
    results: list[dict[str, Any]] = []
    try:
        for workers in args.workers:
            for t in range(args.trials):
                for name in names:
                    if name == "consumer":
                        r = consumer(args, workers) | {"fleet": name, "workers": workers, "trial": t}
                        results.append(r)
                        print(json.dumps(r), flush=True)
                        continue
                    r = trial(fleets[name], args, workers) | {"fleet": name, "workers": workers, "trial": t}
                    results.append(r)
                    print(json.dumps(r), flush=True)
    finally:
        if "ray" in args.fleets:
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()

    def mean_rate(name: str, workers: int) -> float:
        rows = [r for r in results if r["fleet"] == name and r["workers"] == workers]
        return statistics.mean(r["env_steps_per_s"] for r in rows)

    # Of linear: the rate per sampler at the fewest samplers, times the samplers (a fleet's scaling).
    first = min(args.workers)
    head = (
        "| samplers | fleet | env steps/s (mean of trials) | data wait ms/update | Ray / local | of linear |"
    )
    print("\n" + head)
    print("|---|---|---|---|---|---|")
    for workers in args.workers:
        for name in names:
            rows = [r for r in results if r["fleet"] == name and r["workers"] == workers]
            mean = mean_rate(name, workers)
            wait = statistics.mean(r["data_wait_ms"] for r in rows)
            ratio = f"{mean / mean_rate('local', workers):.1%}" if name == "ray" and "local" in names else ""
            linear = "" if name == "consumer" else f"{mean / (workers * mean_rate(name, first) / first):.0%}"
            spread = ", ".join(f"{r['env_steps_per_s']:.0f}" for r in rows)
            print(f"| {workers} | {name} | {mean:.0f} ({spread}) | {wait:.1f} | {ratio} | {linear} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"args": vars(args), "loadavg_1min": os.getloadavg()[0], "results": results}, f, indent=1
            )


if __name__ == "__main__":
    main()
