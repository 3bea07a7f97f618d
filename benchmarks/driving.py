"""Closed-loop driving metrics of two checkpoints, with paired jackknife 95% CIs (FAST §5).

    python -m benchmarks.driving --ckpt A.ckpt --ckpt B.ckpt [--episodes 30] [--seed 20000]
        [--out benchmarks/results/driving_metrics]
    python -m benchmarks.driving --ckpt runs/convergence/sequential_s0/snap_0006.pt \
        --ckpt runs/convergence/dpsa1.0_s0/snap_0006.pt      # a convergence run's snapshots

Both policies play the same evaluation seeds ``seed, seed + 1, ...`` of the env their checkpoints
were trained on (rebuilt from the checkpoint's saved datamodule settings: ``env_id`` and
``env_kwargs``), with actions sampled as in training (seeded; ``--greedy`` takes the argmax, which
for a briefly trained policy is often one action everywhere), each episode to its natural end:
a crash or the env's time limit, no DPSA cut.
The driving metrics (:mod:`fastlight.metrics.driving`) are read from the simulator after every
step by ``fastlight evaluate``'s player and recorder (that command reports them for one checkpoint).
For each metric, the difference B - A gets a leave-one-seed-out jackknife SE and the
interval ``θ ± t(0.975, n - 1) · SE`` (:mod:`benchmarks.stats.jackknife`). FAST reports "no
degradation" when the interval covers zero. Writes ``PREFIX.md`` and ``PREFIX.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.convergence.snapshots import is_snapshot, load_snapshot
from benchmarks.stats.jackknife import jackknife_ratio_difference
from fastlight.checkpoints import read_checkpoint
from fastlight.envs.registry import make_env
from fastlight.evaluation import play_policy
from fastlight.extras import check_extra
from fastlight.metrics.driving import (
    METRICS,
    NOT_IN_HIGHWAY_ENV,
    DrivingEpisode,
    DrivingRecorder,
    DrivingThresholds,
    is_highway_env,
    ratio_of_sums,
)
from fastlight.modules.loading import load_module

#: Metrics where a larger value is better (for the "favours" column); the rest: smaller is better.
HIGHER_IS_BETTER = {"return", "min_ttc_s", "min_headway_m", "min_lateral_clearance_m", "efficiency"}
#: Descriptive rows, neither better nor worse when larger.
NEUTRAL = {"mean_speed_mps", "episode_steps"}


@dataclass
class PolicyRun:
    """One checkpoint's evaluation: per-episode driving sums and returns, seed by seed."""

    label: str
    ckpt: str
    env_id: str
    env_kwargs: dict[str, Any] | None
    global_step: int | None
    episodes: list[DrivingEpisode] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)


def checkpoint_env(path: str, flag: str = "--ckpt") -> tuple[str, dict[str, Any] | None, int | None]:
    """``(env_id, env_kwargs, global_step)`` saved in a checkpoint by its ``RolloutDataModule``, or
    ``(env_id, None, updates)`` of a convergence run's snapshot (``snap_<k>.pt`` next to the run's
    ``summary.json``: :mod:`benchmarks.convergence`), which evaluates with native resets."""
    if is_snapshot(path):
        summary = json.loads((Path(path).parent / "summary.json").read_text())
        snap = torch.load(path, map_location="cpu", weights_only=True)
        return str(summary["env_id"]), None, int(snap["updates"])
    ckpt = read_checkpoint(path, flag=flag)
    data = ckpt.get("datamodule_hyper_parameters") or {}
    if "env_id" not in data:
        raise ValueError(
            f"{flag}: {path} records no datamodule env_id; it was not trained by `fastlight fit`"
        )
    return str(data["env_id"]), data.get("env_kwargs"), ckpt.get("global_step")


def check_same_env(paths: list[str], env: str | None) -> tuple[str, dict[str, Any] | None]:
    """The env both checkpoints were trained on; ``ValueError`` naming the flag when they differ."""
    if len(paths) != 2:
        raise ValueError(f"--ckpt must be given exactly twice (A then B), got {len(paths)}")
    (env_a, kw_a, _), (env_b, kw_b, _) = (checkpoint_env(p) for p in paths)
    if env is not None and env_a != env:
        raise ValueError(f"--ckpt {paths[0]} was trained on {env_a!r}, but --env is {env!r}")
    if env_b != env_a:
        raise ValueError(f"--ckpt {paths[1]} was trained on {env_b!r}, --ckpt {paths[0]} on {env_a!r}")
    if (kw_b or {}) != (kw_a or {}):
        raise ValueError(f"--ckpt {paths[1]} has env_kwargs {kw_b}, --ckpt {paths[0]} has {kw_a}")
    probe = make_env(env_a, env_kwargs=kw_a, flag="--ckpt")
    try:
        highway = is_highway_env(probe)
    finally:
        probe.close()
    if not highway:
        raise ValueError(
            f"--ckpt: the checkpoints were trained on {env_a!r}, not a highway-env scene; the driving "
            "metrics read highway-env's simulator (highway-fast-v0, merge-v0, roundabout-v0, ...)"
        )
    return env_a, kw_a


def evaluate(
    label: str, path: str, *, episodes: int, seed: int, greedy: bool, thresholds: DrivingThresholds
) -> PolicyRun:
    """Play ``episodes`` seeds with checkpoint ``path``'s policy and record the driving metrics."""
    env_id, env_kwargs, step = checkpoint_env(path)
    policy = load_snapshot(path)[0] if is_snapshot(path) else load_module(path).policy
    torch.manual_seed(seed)  # sampled actions are reproducible, and both policies draw the same stream
    recorder = DrivingRecorder(thresholds)
    records, _, _ = play_policy(
        policy,
        env_id,
        env_kwargs or {},
        episodes=episodes,
        seed=seed,
        deterministic=greedy,
        observer=recorder,
    )
    return PolicyRun(
        label, path, env_id, env_kwargs, step, recorder.episodes, [float(r.ret) for r in records]
    )


def _columns(run: PolicyRun, key: str) -> tuple[np.ndarray, np.ndarray, float]:
    if key == "return":
        return np.asarray(run.returns), np.ones(len(run.returns)), 1.0
    num, den, scale = METRICS[key]
    rows = [asdict(ep) for ep in run.episodes]
    return np.asarray([r[num] for r in rows]), np.asarray([r[den] for r in rows]), scale


def compare(a: PolicyRun, b: PolicyRun, quantile: float) -> dict[str, dict[str, Any]]:
    """Per metric: A, B, B - A, its jackknife SE and 95% CI, whether the CI covers 0."""
    rows = {}
    for key in ("return", *METRICS):
        num_a, den_a, scale = _columns(a, key)
        num_b, den_b, _ = _columns(b, key)
        jk = jackknife_ratio_difference(num_a, den_a, num_b, den_b, scale)
        low, high = jk.interval(quantile)
        rows[key] = {
            "a": ratio_of_sums(num_a.sum(), den_a.sum(), scale),
            "b": ratio_of_sums(num_b.sum(), den_b.sum(), scale),
            "diff": jk.estimate,
            "se": jk.se,
            "ci_low": low,
            "ci_high": high,
            "covers_zero": bool(low <= 0.0 <= high) if np.isfinite(jk.se) else None,
        }
    return rows


def _verdict(key: str, row: dict[str, Any]) -> str:
    if not (np.isfinite(row["a"]) or np.isfinite(row["b"])):
        return "n/a in this scene"
    if row["covers_zero"] is None:
        return "undefined (an episode alone carries it)"
    if row["covers_zero"]:
        return "no difference"
    if key in NEUTRAL:
        return "B higher" if row["diff"] > 0 else "B lower"
    better = (row["diff"] > 0) == (key in HIGHER_IS_BETTER)
    return "favours B" if better else "favours A"


def _progress(run: dict[str, Any]) -> str:
    """A checkpoint's global step, or a convergence snapshot's policy updates."""
    if is_snapshot(run["ckpt"]):
        return f"convergence snapshot after {run['global_step']} policy updates"
    return f"global step {run['global_step']}"


def _fmt(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.4g}"


def markdown(result: dict[str, Any]) -> str:
    a, b = result["a"], result["b"]
    lines = [
        "# Closed-loop driving metrics (FAST §5): B vs A, paired jackknife 95% CIs",
        "",
        f"- A: `{a['ckpt']}` ({_progress(a)})",
        f"- B: `{b['ckpt']}` ({_progress(b)})",
        f"- env `{result['env_id']}`, {result['episodes']} evaluation seeds from {result['seed']} (same "
        f"seeds for both), {'greedy' if result['greedy'] else 'sampled'} actions, each episode to its "
        "natural end (crash or time limit; no DPSA cut).",
        f"- CI: B - A ± t(0.975, {result['episodes'] - 1}) · jackknife SE (leave one seed out).",
        f"- Thresholds: {result['thresholds']}.",
        "",
        "| metric | A | B | B - A | 95% CI | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for key, row in result["metrics"].items():
        ci = f"[{_fmt(row['ci_low'])}, {_fmt(row['ci_high'])}]"
        lines.append(
            f"| {key} | {_fmt(row['a'])} | {_fmt(row['b'])} | {_fmt(row['diff'])} | {ci} | "
            f"{_verdict(key, row)} |"
        )
    for key, why in NOT_IN_HIGHWAY_ENV.items():
        lines.append(f"| {key} | n/a | n/a | n/a | n/a | n/a in this scene: {why} |")
    lines += ["", "Command:", "", "```bash", *result["commands"], "```", ""]
    return "\n".join(lines)


def _finite(x: Any) -> Any:
    """``x`` with NaN / inf floats as ``None`` (strict JSON)."""
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.driving",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ckpt", action="append", default=[], help="give twice: policy A, then policy B")
    p.add_argument("--env", default=None, help="refuse checkpoints not trained on this env id")
    p.add_argument("--episodes", type=int, default=30)
    p.add_argument("--seed", type=int, default=20_000)
    p.add_argument(
        "--greedy", action="store_true", help="argmax actions (default: sampled, as in training, seeded)"
    )
    p.add_argument("--out", default="benchmarks/results/driving_metrics", help="writes PREFIX.md/.json")
    p.add_argument("--quick", action="store_true", help="smoke test: 3 episodes")
    p.add_argument("--train-command", action="append", default=[], help="recorded in the report")
    args = p.parse_args(argv)
    episodes = 3 if args.quick else args.episodes
    if episodes < 2:
        p.error(f"--episodes must be >= 2 (the jackknife leaves one out), got {episodes}")
    check_extra("scipy", extra="bench", what="python -m benchmarks.driving")
    from scipy import stats

    try:
        env_id, _ = check_same_env(args.ckpt, args.env)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    thresholds = DrivingThresholds()
    runs = [
        evaluate(label, path, episodes=episodes, seed=args.seed, greedy=args.greedy, thresholds=thresholds)
        for label, path in zip("AB", args.ckpt, strict=True)
    ]
    shown = " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    quantile = float(stats.t.ppf(0.975, episodes - 1))
    result: dict[str, Any] = {
        "env_id": env_id,
        "episodes": episodes,
        "seed": args.seed,
        "greedy": args.greedy,
        "thresholds": asdict(thresholds),
        "t_quantile": quantile,
        "metrics": compare(runs[0], runs[1], quantile),
        "not_in_scene": NOT_IN_HIGHWAY_ENV,
        "commands": [*args.train_command, f"python -m benchmarks.driving {shown}"],
    }
    for label, run in zip("ab", runs, strict=True):
        result[label] = {
            "ckpt": run.ckpt,
            "global_step": run.global_step,
            "returns": run.returns,
            "episodes": [asdict(ep) for ep in run.episodes],
        }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(f"{args.out}.md", "w") as f:
        f.write(markdown(result))
    with open(f"{args.out}.json", "w") as f:
        json.dump(_finite(result), f, indent=1)
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
