"""GIPO vs PPO vs SAPO under policy lag on gymnasium's MuJoCo tasks (AcceRL Table 9), one command.

    python -m benchmarks.objectives --quick                    # 3 envs x 5 variants x 2 seeds, lag 1
    python -m benchmarks.objectives --shard 3/16 --out runs/obj  # one slice of the full grid
    python -m benchmarks.objectives --merge runs/obj/*/        # combine shards, write the report

Every run goes through fastlight's trainer path (``RolloutDataModule`` + ``RLModule`` +
Lightning ``Trainer``, see :mod:`benchmarks.objectives.run`), one process per run, one after
the other. A shard writes ``<out>/<fingerprint>/grid.json`` and one ``runs/<run>.json`` per
finished run; a run whose file exists is skipped, so running the same command again resumes.
``--merge`` refuses shards whose grid fingerprints differ. The report (rliable IQM / mean
normalised score with stratified-bootstrap CIs, probability of improvement, performance
profile) goes to ``--results`` (default ``benchmarks/results``) once every run of the grid is in.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

from benchmarks import child_env
from benchmarks.objectives.grid import (
    MUJOCO_ENVS,
    QUICK_ENVS,
    VARIANTS,
    GridConfig,
    RunSpec,
    check_grid,
    grid_runs,
    parse_shard,
    shard_runs,
)

#: ``--quick``: env steps per run, sized so that 30 runs fit in about 45 minutes on 2 cores.
QUICK_BUDGET = 30_000
FULL_BUDGET = 1_000_000


def build_grid(args: argparse.Namespace) -> GridConfig:
    envs = args.envs or list(QUICK_ENVS if args.quick else MUJOCO_ENVS)
    variants = args.variants or list(VARIANTS)
    lags = args.lags if args.lags is not None else ([1] if args.quick else [0, 1, 3])
    seeds = args.seeds if args.seeds is not None else ([0, 1] if args.quick else [0, 1, 2, 3, 4])
    budget = args.budget or (QUICK_BUDGET if args.quick else FULL_BUDGET)
    check_grid(envs=envs, variants=variants, lags=lags, seeds=seeds, budget=budget)
    return GridConfig(
        envs=tuple(envs),
        variants=tuple(variants),
        lags=tuple(lags),
        seeds=tuple(seeds),
        budget=budget,
        last_k=args.last_k,
    )


def shard_dir(out: str, grid: GridConfig) -> str:
    """``<out>/<fingerprint>``, holding ``grid.json`` and ``runs/``; created if missing."""
    path = os.path.join(out, grid.fingerprint())
    os.makedirs(os.path.join(path, "runs"), exist_ok=True)
    grid_file = os.path.join(path, "grid.json")
    if not os.path.exists(grid_file):
        with open(grid_file, "w") as f:
            json.dump(grid.to_json(), f, indent=1)
    return path


def run_shard(
    grid: GridConfig, runs: list[RunSpec], path: str, *, log: Callable[[str], None] | None = None
) -> list[str]:
    """Run each spec not yet done, each in its own process; returns the failed run names."""
    log = log or (lambda line: print(line, flush=True))  # progress shows even when piped to a file
    failed = []
    for i, spec in enumerate(runs):
        result = os.path.join(path, "runs", f"{spec.name}.json")
        if os.path.exists(result):
            log(f"[{i + 1}/{len(runs)}] {spec.name}: done already, skipped")
            continue
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "benchmarks.objectives.run"]
        cmd += [
            "--grid",
            os.path.join(path, "grid.json"),
            "--run",
            spec.name,
            "--out",
            os.path.join(path, "runs"),
        ]
        with open(os.path.join(path, "runs", f"{spec.name}.log"), "w") as logfile:
            rc = subprocess.call(cmd, stdout=logfile, stderr=subprocess.STDOUT, env=child_env())
        status = "ok" if rc == 0 and os.path.exists(result) else f"FAILED (exit {rc}, see {spec.name}.log)"
        if status != "ok":
            failed.append(spec.name)
        log(f"[{i + 1}/{len(runs)}] {spec.name}: {status} in {time.perf_counter() - t0:.0f} s")
    return failed


def load_shards(dirs: list[str]) -> tuple[GridConfig, list[dict], str]:
    """Grid and run results of shard folders (``<out>/<fingerprint>`` or an ``<out>`` holding
    exactly one); refuses folders of different grids, naming ``--merge``."""
    grids: dict[str, tuple[GridConfig, str]] = {}
    results: dict[str, dict] = {}
    for d in dirs:
        folder = _shard_folder(d)
        with open(os.path.join(folder, "grid.json")) as f:
            grid = GridConfig.from_json(json.load(f))
        grids.setdefault(grid.fingerprint(), (grid, folder))
        runs = os.path.join(folder, "runs")
        for name in sorted(os.listdir(runs)):
            if name.endswith(".json"):
                with open(os.path.join(runs, name)) as f:
                    results[name[:-5]] = json.load(f)
    if len(grids) > 1:
        shown = ", ".join(f"{fp} ({folder})" for fp, (_, folder) in grids.items())
        raise ValueError(f"--merge: the folders hold shards of different grids (fingerprints {shown})")
    (grid, folder), *_ = grids.values()
    return grid, [results[k] for k in sorted(results)], folder


def _shard_folder(d: str) -> str:
    if os.path.exists(os.path.join(d, "grid.json")):
        return d
    subs = [
        os.path.join(d, s) for s in sorted(os.listdir(d)) if os.path.isfile(os.path.join(d, s, "grid.json"))
    ]
    if len(subs) != 1:
        raise ValueError(
            f"--merge: {d} must be a shard folder (with grid.json) or hold exactly one, found {len(subs)}"
        )
    return subs[0]


def measure_throughput(grid: GridConfig, folder: str, *, rounds: int) -> dict[str, dict[str, float]]:
    """The sampler path against a plain loop per env, interleaved (the throughput target's
    measurement, :mod:`benchmarks.objectives.throughput`), cached in ``<folder>/throughput.json``:
    a merge on another machine reuses the numbers of the machine that ran them (delete the file to
    measure again). ``rounds`` 0 skips it."""
    if rounds == 0:
        return {}
    path = os.path.join(folder, "throughput.json")
    cached = {}
    if os.path.exists(path):
        with open(path) as f:
            cached = json.load(f)
    from benchmarks.objectives.throughput import measure_env

    for env in grid.envs:
        if env not in cached:
            print(f"throughput: {env}, {rounds} interleaved rounds", flush=True)
            cached[env] = measure_env(
                env, num_envs=grid.num_envs, rollout_steps=grid.rollout_steps, rounds=rounds, plain_steps=1024
            )
            with open(path, "w") as f:
                json.dump(cached, f, indent=1)
    return {env: cached[env] for env in grid.envs}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 cheap envs x 5 variants x 2 seeds at lag 1")
    p.add_argument("--envs", nargs="+", help=f"MuJoCo v5 ids (default: {' '.join(MUJOCO_ENVS)})")
    p.add_argument("--variants", nargs="+", help=f"ppo, sapo, gipo<sigma> (default: {' '.join(VARIANTS)})")
    p.add_argument("--lags", nargs="+", type=int, help="max_staleness values (default 0 1 3; --quick: 1)")
    p.add_argument("--seeds", nargs="+", type=int, help="default 0..4 (--quick: 0 1)")
    p.add_argument(
        "--budget", type=int, help=f"env steps per run (default {FULL_BUDGET}; --quick {QUICK_BUDGET})"
    )
    p.add_argument("--last-k", type=int, default=10, help="score = mean of the last K curve points")
    p.add_argument("--shard", default="0/1", help="i/n: run slice i of n of the grid")
    p.add_argument("--out", default="runs/objectives", help="shard results go to <out>/<fingerprint>/")
    p.add_argument("--merge", nargs="+", metavar="DIR", help="combine these shard folders and report")
    p.add_argument("--results", default="benchmarks/results", help="where objectives.md/.json/.png go")
    p.add_argument(
        "--throughput-rounds",
        type=int,
        default=30,
        help="interleaved sampler / plain-loop rounds per env for the throughput table (0: skip)",
    )
    args = p.parse_args(argv)
    if args.throughput_rounds < 0:
        p.error(f"--throughput-rounds must be >= 0, got {args.throughput_rounds}")
    if args.last_k < 1:
        p.error(f"--last-k must be >= 1, got {args.last_k}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m benchmarks.objectives " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        if args.merge:
            grid, results, folder = load_shards(args.merge)
        else:
            grid = build_grid(args)
            index, count = parse_shard(args.shard)
            folder = shard_dir(args.out, grid)
            runs = shard_runs(grid_runs(grid), index, count)
            print(
                f"grid {grid.fingerprint()}: {len(grid_runs(grid))} runs, shard {args.shard}: {len(runs)}",
                flush=True,
            )
            failed = run_shard(grid, runs, folder)
            if failed:
                print(f"{len(failed)} runs failed: {failed}", file=sys.stderr)
            grid, results, folder = load_shards([folder])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    missing = len(grid_runs(grid)) - len(results)
    if missing:
        print(f"{missing} of {len(grid_runs(grid))} runs not done yet: no report (merge every shard)")
        return 0
    from benchmarks.objectives.report import write_report

    interleaved = measure_throughput(grid, folder, rounds=args.throughput_rounds)
    write_report(
        grid,
        results,
        results_dir=args.results,
        cache_dir=os.path.dirname(folder),
        command=command,
        interleaved=interleaved,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
