"""``python -m benchmarks.mujoco --env-steps N``: learning per env step, beside CleanRL's, SB3 rl-zoo's
and Tianshou's published PPO, each on its own metric.

Each fastlight run stops at ``N`` env steps (``fastlight.EnvStepBudget``, at the first Rollout
boundary past it) instead of at a wall-clock budget. A run's score is its mean training-episode
return over the last ``--final-steps`` env steps (``env_steps/rollout/return``: each Rollout's mean
over the episodes it completed, with the env-step count as its TensorBoard step); its time is the
process's, from launch (start-up included) to exit. CleanRL's numbers are quoted as published, not
re-run here.

Three metrics, one per peer: CleanRL's is that final training return (stochastic actions); SB3 rl-zoo's
the final policy's deterministic return over 10 episodes (``fastlight evaluate --ckpt last.ckpt``, after
the timed run); Tianshou's the best deterministic evaluation over training. The evaluations during
training are ``fastlight.PeriodicEvaluation``, added on the command line (the config stays as it is)
every ``--eval-every-steps`` env steps (in Rollouts of the config's size), on the seeds ``fastlight
evaluate`` uses; ``eval/return`` is read from TensorBoard with the ``env_steps`` of its update. The best
counts the final evaluation too. The evaluations during training stall it (a few seconds each), so they
are in the minutes; the final one is not.

Writes ``mujoco_env_steps.json`` and ``mujoco_env_steps.png`` (training return vs env steps and vs
seconds, deterministic evaluation vs env steps) and the equal-env-step section of ``mujoco.md`` into
``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

#: CleanRL ``ppo_continuous_action.py`` at 1M env steps (docs.cleanrl.dev, PPO page, the
#: openrlbenchmark table: mean ± s.d. over its 3 seeds): quoted, not re-run.
CLEANRL_1M: dict[str, tuple[float, float | None]] = {
    "Hopper-v4": (2382.86, 271.74),
    "HalfCheetah-v4": (1442.64, 46.03),
    "Walker2d-v4": (2287.95, 571.81),
    # The rest of CleanRL's MuJoCo table, means only (the spread is not quoted with them).
    "InvertedPendulum-v4": (963.1, None),
    "Humanoid-v4": (716.1, None),
    "Pusher-v4": (-40.4, None),  # gymnasium runs it on mujoco < 3 only (fastlight installs 3.3)
}
#: SB3 rl-baselines3-zoo's PPO at 1M env steps (its benchmark.md: one trained agent, its tuned
#: hyperparameters, the deterministic policy over ~150 episodes; mean ± s.d. over those episodes), on
#: the v3 envs (the zoo has no v4 or Humanoid/InvertedPendulum PPO row): quoted, not re-run.
SB3_ZOO_1M: dict[str, tuple[float, float]] = {
    "Hopper-v4": (2410.435, 10.026),
    "HalfCheetah-v4": (5819.099, 663.530),
    "Walker2d-v4": (3478.798, 821.708),
}
#: Tianshou's PPO at 1M env steps (its MuJoCo benchmark: the best deterministic evaluation over
#: training, mean over 10 seeds): quoted, not re-run.
TIANSHOU_1M: dict[str, float] = {"Hopper-v4": 2609.0, "HalfCheetah-v4": 5784.0, "Humanoid-v4": 787.0}
#: Episode ``i`` of every evaluation is reset with ``EVAL_SEED + i`` (PeriodicEvaluation's and
#: ``fastlight evaluate``'s default).
EVAL_SEED = 10_000
#: CleanRL's time to 1M env steps on this 2-core machine (one env, ~1 core busy), as measured when the
#: target was set; the target is 4x sooner.
CLEANRL_MINUTES = 26.0


def read_by_env_steps(root: Path, launch: float) -> dict[str, list[float]]:
    """Per Rollout: env steps, seconds since launch and return, from ``env_steps/rollout/return``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[float]] = {"steps": [], "t": [], "ret": []}
    for events in sorted(root.glob("tb/version_*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        if "env_steps/rollout/return" in acc.Tags()["scalars"]:
            for e in acc.Scalars("env_steps/rollout/return"):
                out["steps"].append(float(e.step))
                out["t"].append(e.wall_time - launch)
                out["ret"].append(e.value)
    return out


def score(series: dict[str, list[float]], final_steps: float) -> dict[str, float]:
    """Mean return over the last ``final_steps`` env steps, and the env steps reached."""
    steps, ret = np.asarray(series["steps"]), np.asarray(series["ret"])
    keep = np.isfinite(ret)
    steps, ret = steps[keep], ret[keep]
    if not len(steps):
        return {"final_return": float("nan"), "env_steps": float("nan")}
    last = ret[steps > steps[-1] - final_steps]
    return {"final_return": float(last.mean()), "env_steps": float(steps[-1])}


def read_evals(root: Path, every_updates: int) -> dict[str, list[float]]:
    """Per evaluation during training: the env steps trained on and ``eval/return``, joined at the
    logger step both were logged at (``env_steps`` is logged at every update). Only the updates that
    evaluated (each ``every_updates``-th, as PeriodicEvaluation counts them) are kept: runs made before
    ``lightning_compat.log_once`` hold a stale copy of ``eval/return`` at every update."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[float]] = {"steps": [], "ret": []}
    for events in sorted(root.glob("tb/version_*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        if not {"eval/return", "env_steps"} <= set(acc.Tags()["scalars"]):
            continue
        at = {e.step: e.value for e in acc.Scalars("env_steps")}
        update = {step: i + 1 for i, step in enumerate(sorted(at))}
        for e in acc.Scalars("eval/return"):
            if e.step in at and update[e.step] % every_updates == 0:
                out["steps"].append(float(at[e.step]))
                out["ret"].append(float(e.value))
    return out


def eval_scores(evals: dict[str, list[float]], final: float, env_steps: float) -> dict[str, Any]:
    """SB3 zoo's metric (the final policy's deterministic return: ``final``, at ``env_steps``) and
    Tianshou's (the best deterministic evaluation over training, the final one included), with the
    curve; an evaluation during training at the final count is the final one's policy, so it gives way."""
    keep = [i for i, s in enumerate(evals["steps"]) if s < env_steps]
    steps = [evals["steps"][i] for i in keep] + [env_steps]
    ret = [evals["ret"][i] for i in keep] + [final]
    finite = [r for r in ret if np.isfinite(r)]
    return {"final_eval": final, "best_eval": max(finite) if finite else float("nan"),
            "evals": {"steps": steps, "ret": ret}}  # fmt: skip


def rollout_size(config: str) -> int:
    """Env steps per update of ``config``: ``num_envs x rollout_steps`` (RolloutDataModule's defaults
    where the config sets none)."""
    import inspect

    import yaml

    from fastlight.data.datamodule import RolloutDataModule

    data = (yaml.safe_load(Path(config).read_text()).get("data") or {}).get("init_args") or {}
    default = inspect.signature(RolloutDataModule.__init__).parameters
    return int(data.get("num_envs", default["num_envs"].default)) * int(
        data.get("rollout_steps", default["rollout_steps"].default)
    )


def eval_every_updates(config: str, every_steps: float) -> int:
    """The whole updates (at least one) of ``config`` nearest ``every_steps`` env steps."""
    return max(1, round(every_steps / rollout_size(config)))


def eval_args(every_updates: int, episodes: int) -> list[str]:
    """The ``fastlight fit`` arguments that add a ``PeriodicEvaluation`` every ``every_updates`` updates
    playing ``episodes`` deterministic episodes; after :func:`budget_args`, whose
    ``--trainer.callbacks.*`` set the last callback."""
    return ["--trainer.callbacks+=fastlight.PeriodicEvaluation",
            "--trainer.callbacks.every_updates", str(every_updates),
            "--trainer.callbacks.episodes", str(episodes), "--trainer.callbacks.seed", str(EVAL_SEED),
            "--trainer.callbacks.save_best", "false"]  # fmt: skip


def final_eval(ckpt: Path, episodes: int, work: Path, name: str, run_cmd: Any) -> float:
    """``fastlight evaluate``'s mean deterministic return of ``ckpt`` over ``episodes`` (seeds from
    ``EVAL_SEED``, as the evaluations during training)."""
    fastlight = str(Path(sys.executable).with_name("fastlight"))
    out, log = work / f"eval_{name}.json", work / f"eval_{name}.log"
    cmd = [fastlight, "evaluate", "--ckpt", str(ckpt), "--episodes", str(episodes), "--seed", str(EVAL_SEED),
           "--out", str(out)]  # fmt: skip
    run_cmd(cmd, seconds=1800, log=log, env=dict(os.environ))
    if not out.exists():
        raise SystemExit(
            f"python -m benchmarks.mujoco: the final evaluation of {ckpt} wrote no result: {log}"
        )
    return float(json.loads(out.read_text())["summary"]["return"]["mean"])


def budget_args(config: str, env_steps: int) -> list[str]:
    """The ``fastlight fit`` arguments that stop a run of ``config`` at ``env_steps``: the config's own
    ``EnvStepBudget`` (its last callback, where jsonargparse's ``--trainer.callbacks.*`` lands) given the
    budget, keeping its other settings (``anneal_lr``), or one added where it has none."""
    import yaml

    callbacks = (yaml.safe_load(Path(config).read_text()).get("trainer") or {}).get("callbacks") or []
    paths = [str(c.get("class_path", "")) if isinstance(c, dict) else "" for c in callbacks]
    if any(p.endswith("EnvStepBudget") for p in paths[:-1]):
        raise SystemExit(
            f"{config}: EnvStepBudget must be the last callback for --env-steps to set its budget"
        )
    setting = ["--trainer.callbacks.total_env_steps", str(env_steps)]
    if paths and paths[-1].endswith("EnvStepBudget"):
        return setting
    return ["--trainer.callbacks+=fastlight.EnvStepBudget", *setting]


def run(env_id: str, seed: int, args: argparse.Namespace, work: Path, run_cmd: Any) -> dict[str, Any]:
    """One fastlight run to ``args.env_steps``; ``run_cmd`` is the race's process runner."""
    root = work / f"fastlight_{env_id}_{seed}"
    fastlight = str(Path(sys.executable).with_name("fastlight"))
    every = eval_every_updates(args.config, args.eval_every_steps)
    cmd = [
        fastlight, "fit", "--config", args.config, "--data.env_id", env_id, "--seed_everything", str(seed),
        "--trainer.max_time", "00:02:00:00", "--trainer.default_root_dir", str(root),
        *budget_args(args.config, args.env_steps),
        *eval_args(every, args.eval_episodes), *args.fastlight_args,
    ]  # fmt: skip
    launch = run_cmd(
        cmd, seconds=2 * 3600 + 120, log=work / f"fastlight_{env_id}_{seed}.log", env=dict(os.environ)
    )
    wall = time.time() - launch
    series = read_by_env_steps(root, launch)
    if not series["steps"]:  # the run failed: say so, never score (or time) it
        log = work / f"fastlight_{env_id}_{seed}.log"
        lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
        why = next((x.strip() for x in reversed(lines) if "fastlight:" in x or "Error" in x), "no output")
        raise SystemExit(f"python -m benchmarks.mujoco: {env_id} seed {seed} logged no return ({why}): {log}")
    got = score(series, args.final_steps)
    final = final_eval(
        root / "checkpoints" / "last.ckpt", args.eval_episodes, work, f"{env_id}_{seed}", run_cmd
    )
    return {"system": "fastlight", "env": env_id, "seed": seed, "command": shlex.join(cmd), "series": series,
            "seconds": wall, "env_steps_per_s": got["env_steps"] / wall, **got,
            **eval_scores(read_evals(root, every), final, got["env_steps"])}  # fmt: skip


def share_of_three_seed_means_at_least(finals: np.ndarray, ref: float) -> float:
    """The share of all 3-seed subsets of ``finals`` [n >= 3] whose mean is at least ``ref``: how often
    a 3-seed comparison (CleanRL's published one is 3 seeds) would come out met, from these seeds."""
    if len(finals) < 3:
        raise ValueError(f"share_of_three_seed_means_at_least needs >= 3 seeds, got {len(finals)}")
    means = [np.mean(c) for c in itertools.combinations(finals, 3)]
    return float(np.mean([m >= ref for m in means]))


def _mean_sd(values: list[float]) -> str:
    """``mean ± s.d.`` of the finite values, ``-`` where there are none (runs from before a metric)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    return f"{x.mean():.0f} ± {x.std():.0f}" if len(x) else "-"


def section(rows: list[dict[str, Any]], args: argparse.Namespace, command: str) -> list[str]:
    """The equal-env-step section of mujoco.md: the table, the targets and the plot."""
    n = args.env_steps
    lines = [
        "## Learning per env step: fastlight vs CleanRL's published PPO",  # write_section replaces it by name
        "",
        f"Command: `{command}`",
        "",
        f"Each run stops at {n:,} env steps (the first Rollout boundary past it), one at a time on this "
        f"machine ({os.cpu_count()} cores); fastlight `{args.config}`. Three scores, each beside the peer "
        f"that reports it: the **final training return** (CleanRL's), the mean training-episode return "
        f"over the last {args.final_steps:,.0f} env steps; the **final deterministic evaluation** (SB3 "
        f"rl-zoo's), `fastlight evaluate --episodes {args.eval_episodes}` of the run's `last.ckpt`; the "
        "**best deterministic evaluation** over training (Tianshou's), `fastlight.PeriodicEvaluation` "
        f"({args.eval_episodes} episodes every ~{args.eval_every_steps:,.0f} env steps, added on the command "
        "line) and the final one. Time: the process's, launch (start-up and the evaluations during "
        "training included) to exit. Peers quoted as published, not re-run: CleanRL "
        "`ppo_continuous_action.py` (docs.cleanrl.dev, openrlbenchmark, 3 seeds); SB3 rl-baselines3-zoo "
        "`benchmark.md` (one agent, on the v3 envs, s.d. over its evaluation episodes); Tianshou's MuJoCo "
        f"PPO benchmark (10 seeds). CleanRL's time, ~{CLEANRL_MINUTES:.0f} min to 1M steps, was measured "
        "on this machine when the target was set.",
        "",
        "| env | seeds | final training return (mean ± s.d.) | per seed | CleanRL at 1M "
        "| final deterministic eval | SB3 zoo at 1M | best deterministic eval | Tianshou at 1M "
        "| minutes to the budget (per seed) | env steps/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for env_id in args.env:
        got = [r for r in rows if r["env"] == env_id]
        if not got:
            continue
        finals = np.array([r["final_return"] for r in got])
        minutes = np.array([r["seconds"] for r in got]) / 60
        ref, ref_sd = CLEANRL_1M[env_id]
        published = f"{ref:.0f}" if ref_sd is None else f"{ref:.0f} ± {ref_sd:.0f}"
        sps = np.mean([r["env_steps_per_s"] for r in got])
        final_evals = [r.get("final_eval", float("nan")) for r in got]
        best_evals = [r.get("best_eval", float("nan")) for r in got]
        sb3, tianshou = SB3_ZOO_1M.get(env_id), TIANSHOU_1M.get(env_id)
        lines.append(
            f"| {env_id} | {len(got)} | {finals.mean():.0f} ± {finals.std():.0f} | "
            f"{', '.join(f'{x:.0f}' for x in finals)} | {published} | {_mean_sd(final_evals)} | "
            f"{'-' if sb3 is None else f'{sb3[0]:.0f} ± {sb3[1]:.0f}'} | {_mean_sd(best_evals)} | "
            f"{'-' if tianshou is None else f'{tianshou:.0f}'} | {minutes.mean():.1f} "
            f"({', '.join(f'{x:.1f}' for x in minutes)}) | {sps:,.0f} |"
        )
        ok = finals.mean() >= ref
        verdicts.append(
            f"- **{'met' if ok else 'MISSED'}** {env_id}: mean return at {n:,} steps >= CleanRL's published "
            "mean: "
            # a ratio to a negative mean (Pusher's) says nothing: the difference then
            f"{finals.mean():.0f} vs {ref:.0f} "
            f"({f'{finals.mean() / ref:.2f}x' if ref > 0 else f'{finals.mean() - ref:+.0f}'})"
        )
        if len(finals) >= 5:  # enough seeds to say how sure the mean is
            from benchmarks.stats.bootstrap import mean_ci

            _, low, high = mean_ci(finals.tolist())
            verdicts.append(
                f"  - {len(finals)} seeds: 95 % bootstrap interval of the mean {low:.0f}-{high:.0f} "
                f"(CleanRL's {ref:.0f} is {'inside' if low <= ref <= high else 'outside'} it); "
                f"{share_of_three_seed_means_at_least(finals, ref):.0%} of the 3-seed subsets of these "
                f"seeds have a mean >= {ref:.0f}"
            )
        for metric, values, peer, ref_eval in (
            ("final deterministic eval", final_evals, "SB3 zoo's", sb3 and sb3[0]),
            ("best deterministic eval", best_evals, "Tianshou's", tianshou),
        ):
            mean = np.nanmean(values) if np.isfinite(values).any() else float("nan")
            if ref_eval is not None and np.isfinite(mean):
                verdicts.append(
                    f"- **{'met' if mean >= ref_eval else 'MISSED'}** {env_id}: mean {metric} >= {peer} "
                    f"published: {mean:.0f} vs {ref_eval:.0f} ({mean / ref_eval:.2f}x)"
                )
        speed = CLEANRL_MINUTES / minutes.mean()
        verdicts.append(
            f"- **{'met' if speed >= 4 else 'MISSED'}** {env_id}: {n:,} steps >= 4x sooner than CleanRL's "
            f"~{CLEANRL_MINUTES:.0f} min: {minutes.mean():.1f} min ({speed:.1f}x)"
        )
    plot = "![training return vs env steps and vs seconds, deterministic evaluation vs env steps]"
    return [*lines, "", *verdicts, "", f"{plot}(mujoco_env_steps.png)", ""]


def plot(rows: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, len(args.env), figsize=(6 * len(args.env), 10.5), squeeze=False)
    for col, env_id in enumerate(args.env):
        ref, ref_sd = CLEANRL_1M[env_id]
        for row, (x, label) in enumerate((("steps", "env steps"), ("t", "seconds since launch"))):
            ax = axes[row][col]
            for r in rows:
                if r["env"] == env_id:
                    ax.plot(
                        r["series"][x],
                        r["series"]["ret"],
                        lw=1,
                        alpha=0.8,
                        label=f"fastlight seed {r['seed']}",
                    )
            ax.axhline(ref, color="k", ls="--", lw=1, label="CleanRL at 1M (published)")
            if ref_sd is not None:
                ax.axhspan(ref - ref_sd, ref + ref_sd, color="k", alpha=0.08)
            if x == "t":
                ax.axvline(
                    60 * CLEANRL_MINUTES / 4, color="tab:red", ls=":", lw=1, label="1/4 of CleanRL's time"
                )
            ax.set_title(env_id)
            ax.set_xlabel(label)
            ax.set_ylabel("training-episode return")
            ax.legend(fontsize=7)
        ax = axes[2][col]
        for r in rows:
            if r["env"] == env_id and "evals" in r:
                ax.plot(r["evals"]["steps"], r["evals"]["ret"], "o-", ms=3, lw=1, alpha=0.8,
                        label=f"fastlight seed {r['seed']}")  # fmt: skip
        if env_id in TIANSHOU_1M:
            ax.axhline(TIANSHOU_1M[env_id], color="k", ls="--", lw=1, label="Tianshou best at 1M (published)")
        if env_id in SB3_ZOO_1M:
            ax.axhline(
                SB3_ZOO_1M[env_id][0], color="tab:green", ls=":", lw=1, label="SB3 zoo at 1M (published)"
            )
        ax.set_title(env_id)
        ax.set_xlabel("env steps")
        ax.set_ylabel(f"deterministic eval return ({args.eval_episodes} episodes)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(rows: list[dict[str, Any]], args: argparse.Namespace, out: Path, command: str) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "mujoco_env_steps.json").write_text(json.dumps({"command": command, "runs": rows}, indent=1))
    plot(rows, args, out / "mujoco_env_steps.png")
    return section(rows, args, command)
