"""``python -m benchmarks.convergence``: wall-clock convergence of PPO + SMPO by reset mode
(FAST §Experiments: DPSA-10 reaches the plateau sooner than sequential and SGR-10).

Each (mode, seed) is one training run on fastlight's own trainer path
(:mod:`benchmarks.convergence.worker`: ``RolloutDataModule`` + ``RLModule`` + Lightning's
``Trainer``, in a fresh process), for the same wall-clock budget. Fair by construction: every
mode has the same PPO settings and at least the same number of *valid* transitions per update
(``--data.valid_steps_per_step``), so the modes differ only in how the data is collected. The policy
is saved every ``--eval-every-s`` seconds of training; afterwards every snapshot plays the same
evaluation seeds to their natural end (no DPSA cut, :func:`fastlight.evaluation.run_episodes`), so
return is plotted against training wall-clock with evaluation time excluded.

The peer row (``--peer sb3``, on by default when ``stable_baselines3`` imports; ``--no-peer`` skips
it) is Stable-Baselines3's PPO with highway-env's recipe on the same env, scenario load, env count,
budget, snapshots and evaluation (:mod:`benchmarks.convergence.sb3`). It has its own row and
curve but does not set the target, which stays a comparison of fastlight's reset modes.

Writes ``convergence.md``, ``convergence.json`` and ``convergence.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks import child_env
from benchmarks.convergence.race import race_to_peer_final, time_to_target
from benchmarks.convergence.report import EVAL_SEED, SB3_LABEL, markdown, plot, target_lines
from benchmarks.convergence.worker import PPO, RunConfig
from benchmarks.sampling.procs import default_workers
from benchmarks.stats.bootstrap import diff_of_means_ci, mean_ci, ratio_of_means_ci
from fastlight.envs.registry import check_env_id

if TYPE_CHECKING:
    from benchmarks.convergence.sb3 import Sb3RunConfig

MODES = ("sequential", "sgr", "autoreset", "dpsa0.5", "dpsa1.0")
QUICK = {"seeds": [0], "budget_s": 75.0, "eval_every_s": 15.0, "eval_episodes": 5}
PEERS = ("sb3",)


def sb3_available() -> bool:
    return importlib.util.find_spec("stable_baselines3") is not None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.convergence", description=__doc__.split("\n")[0])
    p.add_argument("--env", default="highway-fast-v0", help="any gymnasium id (Discrete or Box actions)")
    p.add_argument(
        "--modes", nargs="+", default=list(MODES), help=f"from {', '.join(MODES)} (dpsaX: threshold X)"
    )
    p.add_argument("--clips", type=int, default=10, help="parallel clips of every mode but sequential (1)")
    p.add_argument(
        "--workers", type=int, default=default_workers(), help="sampler processes (default: cores)"
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budget-s", type=float, default=600.0, help="training wall-clock per run")
    p.add_argument("--eval-every-s", type=float, default=30.0, help="snapshot period (training seconds)")
    p.add_argument("--eval-episodes", type=int, default=10, help="evaluation episodes per snapshot")
    p.add_argument(
        "--greedy",
        action="store_true",
        help="evaluate with argmax actions (default: sampled, seeded alike for every snapshot)",
    )
    p.add_argument("--valid-steps-per-update", type=int, default=256, help="valid transitions per update")
    p.add_argument(
        "--scenario-load-cost-s", type=float, default=0.3, help="emulated load per reset (0: native)"
    )
    p.add_argument("--target-frac", type=float, default=0.9, help="target = this x best final mean return")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--runs-dir", type=Path, default=None, help="snapshots (default: <out>/convergence_runs)")
    p.add_argument(
        "--peer",
        choices=PEERS,
        default=None,
        help="peer row: sb3 = Stable-Baselines3 PPO (default when stable_baselines3 imports)",
    )
    p.add_argument("--no-peer", action="store_true", help="skip the peer row")
    p.add_argument("--quick", action="store_true", help=f"about 10 minutes: {QUICK}")
    args = p.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    _check(args)
    return args


def parse_mode(name: str) -> tuple[str, float]:
    """``dpsa0.5`` -> ("dpsa", 0.5); other modes have threshold 0.5 (unused)."""
    if name.startswith("dpsa") and name != "dpsa":
        return "dpsa", float(name[4:])
    return name, 0.5


def _check(args: argparse.Namespace) -> None:
    for name in args.modes:
        try:
            mode, thr = parse_mode(name)
        except ValueError:
            raise SystemExit(
                f"--modes must be from {', '.join(MODES)} (dpsaX, X in (0, 1]), got {name!r}"
            ) from None
        if mode not in ("sequential", "sgr", "autoreset", "dpsa") or not 0 < thr <= 1:
            raise SystemExit(f"--modes must be from {', '.join(MODES)} (dpsaX, X in (0, 1]), got {name!r}")
    if args.clips < 1:
        raise SystemExit(f"--clips must be >= 1, got {args.clips}")
    if args.workers < 1:
        raise SystemExit(f"--workers must be >= 1, got {args.workers}")
    if not args.eval_every_s > 0:
        raise SystemExit(f"--eval-every-s must be > 0, got {args.eval_every_s}")
    if args.budget_s < args.eval_every_s:
        raise SystemExit(
            f"--budget-s ({args.budget_s:g}) is too short to evaluate once: it must be >= --eval-every-s "
            f"({args.eval_every_s:g})"
        )
    if args.eval_episodes < 1 or args.valid_steps_per_update < 1:
        raise SystemExit("--eval-episodes and --valid-steps-per-update must be >= 1")
    if args.scenario_load_cost_s < 0:
        raise SystemExit(f"--scenario-load-cost-s must be >= 0, got {args.scenario_load_cost_s}")
    if not 0 < args.target_frac <= 1:
        raise SystemExit(f"--target-frac must be in (0, 1], got {args.target_frac}")
    if args.no_peer and args.peer is not None:
        raise SystemExit(f"--peer {args.peer} and --no-peer exclude each other: give one of them")
    if args.peer == "sb3" and not sb3_available():
        raise SystemExit(
            "--peer sb3 needs stable_baselines3, from the optional 'bench' extra: "
            "pip install 'fastlight[bench]' (or pass --no-peer)"
        )
    if args.peer is None and not args.no_peer and sb3_available():
        args.peer = "sb3"
    try:
        check_env_id(args.env, flag="--env")
    except ValueError as e:
        raise SystemExit(str(e)) from None


# ---------------------------------------------------------------------- training and evaluation
def run_one(cfg: RunConfig | Sb3RunConfig, worker: str = "benchmarks.convergence.worker") -> dict[str, Any]:
    """Train one run in a fresh process (its samplers or env processes are its children) with the
    ``worker`` module (:mod:`benchmarks.convergence.worker`, or :mod:`benchmarks.convergence.sb3` for
    the peer); returns its summary."""
    folder = Path(cfg.folder)
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / "summary.json"
    # A rerun of an interrupted bench resumes: a finished run with the same settings is kept.
    if done.exists() and (folder / "run.json").exists():
        if json.loads((folder / "run.json").read_text()) == json.loads(json.dumps(asdict(cfg))):
            return json.loads(done.read_text())
    (folder / "run.json").write_text(json.dumps(asdict(cfg)))
    env = child_env(OMP_NUM_THREADS="1")
    # Budget + start-up + generous slack: a run that hangs is stopped, never waited on forever.
    timeout = cfg.budget_s * 2 + 600
    proc = subprocess.run(
        [sys.executable, "-m", worker, str(folder / "run.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"training run {cfg.label} seed {cfg.seed} failed:\n{proc.stderr[-4000:]}")
    return json.loads((folder / "summary.json").read_text())


def evaluate_run(summary: dict[str, Any], *, episodes: int, greedy: bool = False) -> list[dict[str, float]]:
    """Every snapshot of a run on the same evaluation seeds: ``[{t, updates, valid_steps, return}]``.

    Actions are sampled by default, with torch's generator reseeded before every snapshot: on
    highway-fast-v0 an untrained policy's argmax is one constant action (e.g. always SLOWER), which
    already survives the 30-step episode and scores about 21 of 30, so a greedy curve starts at
    its plateau and every mode "reaches the target" at t = 0. The sampled policy is the one that
    trains and the one whose crashes the driving metrics count.
    """
    import torch

    from benchmarks.convergence.snapshots import run_policy
    from fastlight.evaluation import policy_act_fn, run_episodes

    policy = run_policy(summary)
    curve = []
    for path in sorted(Path(summary["folder"]).glob("snap_*.pt")):
        snap = torch.load(path, map_location="cpu", weights_only=True)
        policy.load_state_dict(snap["policy"])
        torch.manual_seed(EVAL_SEED)
        eps = run_episodes(
            summary["env_id"], policy_act_fn(policy, deterministic=greedy), episodes=episodes, seed=EVAL_SEED
        )
        curve.append(
            {
                "t": float(snap["t"]),
                "updates": int(snap["updates"]),
                "valid_steps": int(snap["valid_steps"]),
                "return": float(np.mean([e.ret for e in eps])),
                "length": float(np.mean([e.length for e in eps])),
            }
        )
    return curve


def measure_step_s(env_id: str, steps: int = 300, seed: int = 0) -> float:
    """Median seconds of one real ``env.step`` with random actions (resets not timed)."""
    from fastlight.envs.registry import make_env

    env = make_env(env_id, flag="--env")
    env.reset(seed=seed)
    env.action_space.seed(seed)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        times.append(time.perf_counter() - t0)
        if term or trunc:
            env.reset()
    env.close()
    return float(np.median(times))


# ---------------------------------------------------------------------- summary
def summarise(
    runs: list[dict[str, Any]],
    modes: Sequence[str],
    target_frac: float,
    budget_s: float,
    peers: Sequence[str] = (),
) -> dict[str, Any]:
    """Target, per-run time to target, and per-mode figures with bootstrap CIs over seeds.

    ``peers`` (e.g. ``sb3-ppo``) get rows like the modes but do not set the target (the best final
    return of fastlight's ``modes``); with a peer, ``peer_race`` says whether the best mode reaches
    the peer's final return sooner than the peer (:func:`race_to_peer_final`).

    A speed-up with a run that never reached the target uses the budget as that run's time
    (censored): the ratio is then a bound, marked ``bound: ">="`` (the baseline never got there) or
    ``"<="`` (the mode never did); ``n/a`` when neither side ever did.
    """
    labels = [*modes, *peers]
    finals = {m: [r["curve"][-1]["return"] for r in runs if r["label"] == m] for m in labels}
    best = max(float(np.mean(finals[m])) for m in modes if finals[m])
    target = target_frac * best
    for r in runs:
        r["time_to_target"] = time_to_target(
            [c["t"] for c in r["curve"]], [c["return"] for c in r["curve"]], target
        )
        r["effective_tps"] = r["valid_steps"] / max(r["train_s"], 1e-9)
        r["valid_per_update"] = r["valid_steps"] / max(r["updates"], 1)
    ttt = {m: [r["time_to_target"] for r in runs if r["label"] == m] for m in labels}
    out: dict[str, Any] = {"target": target, "best_final_mean": best, "modes": {}}
    for m in labels:
        mine = [r for r in runs if r["label"] == m]
        row = {
            "seeds": len(mine),
            "final_return": mean_ci(finals[m]),
            "time_to_target": mean_ci(ttt[m]),
            "effective_tps": float(np.mean([r["effective_tps"] for r in mine])),
            "updates": float(np.mean([r["updates"] for r in mine])),
            "valid_per_update": float(np.mean([r["valid_per_update"] for r in mine])),
        }
        for base in ("sequential", "sgr"):
            if base in ttt and ttt[base]:
                b_inf, m_inf = any(map(math.isinf, ttt[base])), any(map(math.isinf, ttt[m]))
                cens = [[min(t, budget_s) for t in ttt[k]] for k in (base, m)]
                row[f"speedup_vs_{base}"] = (math.nan,) * 3 if b_inf and m_inf else ratio_of_means_ci(*cens)
                row[f"speedup_vs_{base}_bound"] = (
                    ">=" if b_inf and not m_inf else "<=" if m_inf and not b_inf else ""
                )
        if "sequential" in finals and finals["sequential"]:
            row["final_minus_sequential"] = diff_of_means_ci(finals[m], finals["sequential"])
        out["modes"][m] = row

    def curves(label: str) -> list[tuple[list[float], list[float]]]:
        mine = [r["curve"] for r in runs if r["label"] == label]
        return [([c["t"] for c in cv], [c["return"] for c in cv]) for cv in mine]

    for p in peers:
        if finals[p]:
            out.setdefault("peer_race", {})[p] = race_to_peer_final(
                {m: curves(m) for m in modes}, curves(p), budget_s=budget_s
            )
    return out


def _strict(x: Any) -> Any:
    """JSON without ``Infinity``: a run that never reaches the target is ``null`` ("never")."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    return x


def _sb3_status(peer: str | None) -> str:
    if peer == "sb3":
        return "run."
    if not sb3_available():
        return (
            "stable_baselines3 is not installed in this environment (no network to install it); "
            "it is declared in the `bench` extra."
        )
    return "skipped (--no-peer)."


def _run_sb3(args: argparse.Namespace, seed: int, runs_dir: Path) -> dict[str, Any]:
    """The SB3 peer's run for ``seed`` (resumable as the modes' runs) and its evaluated curve."""
    from benchmarks.convergence.sb3 import Sb3RunConfig, evaluate_sb3_run

    cfg = Sb3RunConfig(
        env_id=args.env,
        num_envs=args.clips,
        seed=seed,
        budget_s=args.budget_s,
        every_s=args.eval_every_s,
        valid_steps_per_update=args.valid_steps_per_update,
        scenario_load_cost_s=args.scenario_load_cost_s,
        folder=str(runs_dir / f"{SB3_LABEL}_s{seed}"),
    )
    summary = run_one(cfg, worker="benchmarks.convergence.sb3")
    summary["label"] = SB3_LABEL
    summary["curve"] = evaluate_sb3_run(
        summary, episodes=args.eval_episodes, seed=EVAL_SEED, greedy=args.greedy
    )
    return summary


def _progress(runs: list[dict[str, Any]], total: int, name: str, seed: int, t: float) -> None:
    r = runs[-1]
    print(
        f"[{len(runs)}/{total}] {name} seed {seed}: {r['updates']} updates, "
        f"{r['valid_steps']} valid, final return {r['curve'][-1]['return']:.2f} "
        f"({time.perf_counter() - t:.0f} s)",
        file=sys.stderr,
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    t0, load_before = time.perf_counter(), os.getloadavg()
    runs_dir = args.runs_dir or args.out / "convergence_runs"
    step_s = measure_step_s(args.env)
    runs = []
    peers = [SB3_LABEL] if args.peer == "sb3" else []
    total = len(args.seeds) * (len(args.modes) + len(peers))
    sb3_run: dict[str, Any] | None = None
    for seed in args.seeds:  # seeds outermost: a slow drift of machine load hits every mode alike
        for name in [*args.modes, *peers]:
            t = time.perf_counter()
            if name == SB3_LABEL:
                summary = _run_sb3(args, seed, runs_dir)
                sb3_run = {k: summary[k] for k in ("num_envs", "n_steps", "model")}
                runs.append(summary)
                _progress(runs, total, name, seed, t)
                continue
            mode, thr = parse_mode(name)
            cfg = RunConfig(
                env_id=args.env,
                mode=mode,
                threshold=thr,
                clips=args.clips,
                workers=args.workers,
                seed=seed,
                budget_s=args.budget_s,
                every_s=args.eval_every_s,
                valid_steps_per_update=args.valid_steps_per_update,
                scenario_load_cost_s=args.scenario_load_cost_s,
                folder=str(runs_dir / f"{name}_s{seed}"),
                model=dict(PPO),
            )
            summary = run_one(cfg)
            summary["label"] = name
            summary["curve"] = evaluate_run(summary, episodes=args.eval_episodes, greedy=args.greedy)
            runs.append(summary)
            _progress(runs, total, name, seed, t)
    s = summarise(runs, args.modes, args.target_frac, args.budget_s, peers=peers)
    meta = {
        "command": ("python -m benchmarks.convergence " + shlex.join(argv)).strip(),
        "quick": args.quick,
        "env": args.env,
        "clips": args.clips,
        "workers": args.workers,
        "budget_s": args.budget_s,
        "eval_every_s": args.eval_every_s,
        "eval_episodes": args.eval_episodes,
        "greedy": args.greedy,
        "valid_steps_per_update": args.valid_steps_per_update,
        "scenario_load_cost_s": args.scenario_load_cost_s,
        "target_frac": args.target_frac,
        "model": dict(PPO),
        "step_s": step_s,
        "raw_ceiling_tps": (os.cpu_count() or 1) / step_s,
        "sb3": _sb3_status(args.peer),
        "sb3_run": sb3_run,
        "load_before": "/".join(f"{x:.1f}" for x in load_before),
        "load_after": "/".join(f"{x:.1f}" for x in os.getloadavg()),
        "total_s": time.perf_counter() - t0,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "convergence.json").write_text(
        json.dumps(_strict({"meta": meta, "summary": s, "runs": runs}), indent=1, allow_nan=False) + "\n"
    )
    plot(runs, args.modes, s["target"], args.out / "convergence.png", peers=peers)
    (args.out / "convergence.md").write_text(markdown(runs, s, meta))
    print(target_lines(s)[-1], file=sys.stderr)  # the SB3 peer's target (or why it was not run)
    print(f"wrote {args.out}/convergence.md, .json, .png in {meta['total_s']:.0f} s", file=sys.stderr)
    return {"meta": meta, "summary": s, "runs": runs}


if __name__ == "__main__":
    main()
