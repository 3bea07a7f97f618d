"""``python -m benchmarks.sampling``: FAST's sampling comparison (FAST §execution time,
§effective throughput, §episode length) with real environment stepping.

``--path procs`` (the default) measures fastlight's real path: a ``RolloutDataModule`` with its
sampler processes (``--workers``, one per core by default) and a fixed random policy over the
env's own action space (:mod:`benchmarks.sampling.procs`), so the table shows what a
training run gets. ``--path single`` steps every env in this one process with a Collector
(:mod:`benchmarks.sampling.runs`), the ceiling of one sampler, and adds the emulated
``shared_sim`` setting.

For each clip count it runs ``sequential`` (the baseline: one env, autoreset), ``sgr``,
``autoreset`` and ``dpsa`` at each threshold, under three settings (see
:mod:`benchmarks.sampling.runs`): ``native`` resets, an ``emulated_reset`` of
``--reset-cost`` seconds per env reset, and FAST's ``shared_sim`` (emulated). Every run
collects the same number of *valid* transitions (whole cycles, so a run may overshoot by less
than one cycle) with a fixed random policy, and the speed-ups are effective-throughput ratios
against ``sequential`` measured in the same invocation. To spread slow drifts of machine load
evenly over all modes, the matrix is run ``--rounds`` times, each round collecting
``valid_steps / rounds`` per cell, and the counters are summed.

Writes ``sampling.md`` (tables, the exact command, the model, targets), ``sampling.json`` (a
list of rows) and ``sampling.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.sampling.procs import default_workers, run_procs
from benchmarks.sampling.report import write_outputs
from benchmarks.sampling.runs import SETTINGS, BenchEnv, RunSpec, RunTotals, run_spec
from fastlight.envs.registry import check_env_id

QUICK = {"clips": [1, 10], "valid_steps": 60, "rounds": 1}
PATHS = ("procs", "single")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sampling", description=__doc__.split("\n")[0])
    p.add_argument("--env", default="highway-fast-v0",
                   help="gymnasium id (Discrete or Box actions; --path single: Discrete only)")
    p.add_argument("--path", default="procs", choices=PATHS,
                   help="procs: the RolloutDataModule's sampler processes (what training gets); "
                   "single: one process")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="sampler processes with --path procs (default: one per core)")
    p.add_argument("--clips", type=int, nargs="+", default=[1, 10, 30], help="numbers of parallel clips")
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.5, 0.75, 1.0], help="DPSA thresholds")
    p.add_argument("--reset-cost", type=float, default=0.3, help="emulated seconds per env reset")
    p.add_argument("--shared-step-s", type=float, default=0.015,
                   help="shared_sim tick latency (fixed, so that the model does not depend on machine load)")
    p.add_argument("--valid-steps", type=int, default=600, help="valid transitions per cell (all rounds)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of the whole matrix")
    p.add_argument("--settings", nargs="+", default=None, choices=SETTINGS,
                   help="default: all with --path single; native and emulated_reset with --path procs")
    p.add_argument("--lengths-only", type=int, default=0, metavar="N",
                   help="with shared_sim: run the real setting's sequential cell only, for N valid "
                   "transitions before the first round, as the shared simulator's episode lengths (uncut "
                   "episodes); the real multi-clip cells are skipped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--quick", action="store_true", help=f"a run of about a minute: {QUICK}")
    args = p.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    _check(args)
    return args


def _check(args: argparse.Namespace) -> None:
    if args.settings is None:
        args.settings = list(SETTINGS) if args.path == "single" else ["native", "emulated_reset"]
    if args.path == "procs" and "shared_sim" in args.settings:
        raise SystemExit("--settings shared_sim is an in-process emulation: use it with --path single")
    if args.workers < 1:
        raise SystemExit(f"--workers must be >= 1, got {args.workers}")
    try:
        check_env_id(args.env, flag="--env")
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if min(args.clips) < 1:
        raise SystemExit(f"--clips must all be >= 1, got {args.clips}")
    if not all(0.0 <= t <= 1.0 for t in args.thresholds):
        raise SystemExit(f"--thresholds must be in [0, 1], got {args.thresholds}")
    if args.reset_cost < 0 or args.valid_steps < 1 or args.rounds < 1:
        raise SystemExit("--reset-cost must be >= 0, --valid-steps and --rounds >= 1")
    if "shared_sim" in args.settings and not {"native", "emulated_reset"} & set(args.settings):
        raise SystemExit("--settings shared_sim needs a real setting first (its episode lengths)")
    if args.lengths_only < 0:
        raise SystemExit(f"--lengths-only must be >= 0 (0: off), got {args.lengths_only}")
    if args.lengths_only and "shared_sim" not in args.settings:
        raise SystemExit("--lengths-only needs --settings shared_sim (it feeds the shared simulator)")


def plan(
    settings: Sequence[str], clips: Sequence[int], thresholds: Sequence[float], lengths_only: bool = False
) -> list[RunSpec]:
    """Rows in report order: per setting, ``sequential`` once, then every mode per clip count
    (``lengths_only``: a real setting only ``sequential``, the shared simulator's episode lengths)."""
    specs = []
    for setting in settings:
        specs.append(RunSpec(setting, "sequential", 1))
        if lengths_only and setting != "shared_sim":
            continue
        for c in clips:
            specs.append(RunSpec(setting, "sgr", c))
            if setting != "shared_sim":  # one shared simulator has only a global reset
                specs.append(RunSpec(setting, "autoreset", c))
            specs.extend(RunSpec(setting, "dpsa", c, t) for t in thresholds)
    return specs


def _prepare_shared(be: BenchEnv, totals: dict[RunSpec, RunTotals], args: argparse.Namespace) -> None:
    """Episode pool of the emulated shared simulator: the complete episodes of the first real
    setting ((a) and (b) replay the same episodes, so one of them is enough)."""
    first = next(s for s in args.settings if s != "shared_sim")
    be.episode_pool = sorted(ep for s, t in totals.items() if s.setting == first for ep in t.complete)
    be.shared_step_s = args.shared_step_s


def run_matrix(
    specs: Sequence[RunSpec], be: BenchEnv, args: argparse.Namespace
) -> dict[RunSpec, RunTotals]:
    """Run each distinct spec ``args.rounds`` times, interleaved; totals per canonical spec."""
    unique = list(dict.fromkeys(s.canonical() for s in specs))
    totals = {s: RunTotals() for s in unique}
    per_round = math.ceil(args.valid_steps / args.rounds)
    n = len(unique) * args.rounds
    for r in range(args.rounds):
        for k, spec in enumerate(unique):
            steps = per_round
            if args.lengths_only and spec.setting != "shared_sim":  # the length source: once, first
                if r:
                    continue
                steps = args.lengths_only
            if spec.setting == "shared_sim" and not be.episode_pool:
                _prepare_shared(be, totals, args)
            t0 = time.perf_counter()
            seed = args.seed + 1000 * r
            if args.path == "procs":
                run_procs(
                    spec, be, valid_steps=steps, seed=seed, totals=totals[spec], workers=args.workers
                )
            else:
                run_spec(spec, be, valid_steps=steps, seed=seed, totals=totals[spec])
            eff = float(totals[spec].metric.compute()["effective_tps"])
            print(f"[{r * len(unique) + k + 1}/{n}] {spec.setting:>14} {spec.mode:>10} "
                  f"thr={spec.threshold} clips={spec.clips}: {eff:7.1f} valid/s "
                  f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    return totals


def _num(x: Any) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


def make_row(
    spec: RunSpec, totals: RunTotals, seq_eff: float, reset_cost_s: float, *, path: str = "single",
    workers: int = 1,
) -> dict[str, Any]:
    m = {k: float(v) for k, v in totals.metric.compute().items()}
    c = totals.metric.totals()
    lengths = np.asarray(totals.lengths, dtype=float)  # see RunTotals: what the learner receives
    mean_len = float(lengths.mean()) if len(lengths) else math.nan
    se = float(lengths.std(ddof=1) / math.sqrt(len(lengths))) if len(lengths) > 1 else math.nan
    canon = spec.canonical()
    return {
        "setting": spec.setting, "mode": spec.mode, "threshold": spec.threshold, "clips": spec.clips,
        "path": path,
        "workers": 1 if path == "single" or spec.mode == "sequential" else min(workers, spec.clips),
        "elapsed_s": c["elapsed"],
        "reset_cost_s": 0.0 if spec.setting == "native" else reset_cost_s,
        "raw_tps": m["raw_tps"], "effective_tps": m["effective_tps"],
        "sample_efficiency": m["sample_efficiency"], "time_efficiency": m["time_efficiency"],
        "mean_episode_length": _num(mean_len),
        "speedup_vs_sequential": m["effective_tps"] / seq_eff,
        "mean_episode_length_se": _num(se), "resets_per_1k_valid": m["resets_per_1k_valid"],
        "truncated_episode_share": _num(m["truncated_episode_share"]),
        "valid_steps": int(c["valid_steps"]), "raw_steps": int(c["raw_steps"]),
        "episodes": len(lengths), "global_resets": int(c["global_resets"]),
        "wall_s": c["wall_time"], "step_s": c["step_time"], "reset_s": c["reset_time"],
        "other_s": c["wall_time"] - c["step_time"] - c["reset_time"],
        "same_as": None if canon == spec else f"{canon.mode} (identical code path at 1 clip)",
    }


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    t0, load_before = time.perf_counter(), os.getloadavg()
    be = BenchEnv(env_id=args.env, reset_cost_s=args.reset_cost)
    specs = plan(args.settings, args.clips, args.thresholds, bool(args.lengths_only))
    totals = run_matrix(specs, be, args)
    if not be.episode_pool:  # --path procs: the natural episodes of sequential / autoreset, for the report
        _prepare_shared(be, totals, args)
    rows = []
    for spec in specs:
        seq = totals[RunSpec(spec.setting, "sequential", 1)]
        seq_eff = float(seq.metric.compute()["effective_tps"])
        rows.append(make_row(spec, totals[spec.canonical()], seq_eff, args.reset_cost, path=args.path,
                             workers=args.workers))
    meta = {
        "command": ("python -m benchmarks.sampling " + shlex.join(argv)).strip(),
        "env": args.env, "path": args.path, "workers": args.workers,
        "reset_cost_s": args.reset_cost, "shared_step_s": be.shared_step_s,
        "valid_steps": args.valid_steps, "rounds": args.rounds, "seed": args.seed,
        "episode_pool": be.episode_pool, "total_s": time.perf_counter() - t0,
        "load_before": load_before, "load_after": os.getloadavg(),
    }
    write_outputs(rows, meta, args.out)
    print(f"wrote {args.out}/sampling.md, sampling.json, sampling.png in {meta['total_s']:.0f} s",
          file=sys.stderr)
    return rows


if __name__ == "__main__":
    main()
