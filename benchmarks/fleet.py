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
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace
from typing import Any

from fastlight.data.datamodule import RolloutDataModule
from fastlight.models.mlp import MLPActorCritic
from fastlight.sampling.pool import LocalFleet
from fastlight.sampling.ray_fleet import RayFleet


def trial(fleet: Any, args: argparse.Namespace, workers: int) -> dict[str, float]:
    dm = RolloutDataModule(
        env_id=args.env_id, env_kwargs=json.loads(args.env_kwargs), num_envs=workers * args.envs_per_worker,
        num_workers=workers, max_horizon=args.max_horizon, fleet=fleet, start_method="spawn", seed=0,
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
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if "ray" in args.fleets:
        import ray

        ray.init(
            address="local", num_cpus=max(args.workers), include_dashboard=False, logging_level="warning"
        )
    fleets = {"local": LocalFleet(), "ray": RayFleet()}
    results: list[dict[str, Any]] = []
    try:
        for workers in args.workers:
            for t in range(args.trials):
                for name in args.fleets:
                    r = trial(fleets[name], args, workers) | {"fleet": name, "workers": workers, "trial": t}
                    results.append(r)
                    print(json.dumps(r), flush=True)
    finally:
        if "ray" in args.fleets:
            ray.shutdown()
    print("\n| samplers | fleet | env steps/s (mean of trials) | data wait ms/update | Ray / local |")
    print("|---|---|---|---|---|")
    for workers in args.workers:
        mean = {}
        for name in args.fleets:
            rows = [r for r in results if r["fleet"] == name and r["workers"] == workers]
            mean[name] = statistics.mean(r["env_steps_per_s"] for r in rows)
            wait = statistics.mean(r["data_wait_ms"] for r in rows)
            ratio = f"{mean[name] / mean['local']:.1%}" if name == "ray" and "local" in mean else ""
            spread = ", ".join(f"{r['env_steps_per_s']:.0f}" for r in rows)
            print(f"| {workers} | {name} | {mean[name]:.0f} ({spread}) | {wait:.1f} | {ratio} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
