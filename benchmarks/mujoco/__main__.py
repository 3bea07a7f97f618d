"""``python -m benchmarks.mujoco``: learning per wall-clock second on MuJoCo, fastlight against
Sample Factory, side by side in one run; with ``--env-steps N``, learning per env step beside CleanRL's
published PPO (:mod:`benchmarks.mujoco.env_steps`).

For every env and seed, one after the other (never at once: both use every core):

1. the **plain-loop ceiling**: env steps per second of a bare ``gymnasium`` loop with random actions,
   one env in this process, for ``--ceiling-s`` seconds (what one core can step);
2. **Sample Factory** (``sf_examples.mujoco.train_mujoco``, its own MuJoCo defaults: MLP 64x64,
   rollout 64, batch 1024, 2 epochs, input and return normalisation) with ``--num_workers 2
   --num_envs_per_worker 8 --device cpu``, in its own virtualenv (``--sf-python``: Sample Factory
   2.1.1 needs gymnasium < 1.0), stopped after ``--minutes``;
3. **fastlight**: ``fastlight fit --config configs/mujoco_ppo_fast.yaml --data.env_id ENV --seed_everything
   SEED --trainer.max_time`` for the same minutes (the config for return per second; ``--env-steps``
   runs ``configs/mujoco_ppo.yaml``, the one for return per env step).

Both are timed from their process's launch, start-up included: what a user waits. Training-episode
returns: Sample Factory's ``Avg episode reward`` lines (its running mean over recent episodes) with
their timestamps; fastlight's ``rollout/return`` (completed episodes of each Rollout) with the
TensorBoard event times. The score of a run is the mean return over its last ``--final-s`` seconds;
env steps per second are the runs' frame counters over their training time.

Writes the equal-wall-clock section of ``mujoco.md``, ``mujoco.json`` and ``mujoco.png`` (return vs
wall-clock) into ``--out``; each mode rewrites only its own section of ``mujoco.md``.
``--add-to mujoco.json`` adds this run's seeds to an earlier run's (its runs, curves included, are kept;
the ceilings are this run's): e.g. a third seed after two.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.mujoco import env_steps

ROOT = Path(__file__).resolve().parents[2]
#: The configs each mode runs by default: return per wall-clock second, return per env step.
RACE_CONFIG = "configs/mujoco_ppo_fast.yaml"
ENV_STEPS_CONFIG = "configs/mujoco_ppo.yaml"
#: Sample Factory's env names for the gymnasium ids (sf_examples.mujoco.mujoco_utils).
SF_ENVS = {
    "Hopper-v4": "mujoco_hopper",
    "HalfCheetah-v4": "mujoco_halfcheetah",
    "Walker2d-v4": "mujoco_walker",
}
_SF_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
_SF_REWARD = re.compile(r"Avg episode reward: \[\(0, '([-0-9.naninf]+)'\)\]")
_SF_FRAMES = re.compile(r"Total num frames: (\d+)")


def plain_loop_sps(env_id: str, seconds: float, seed: int) -> float:
    """Env steps per second of a bare loop over one env with random actions (resets included)."""
    import gymnasium as gym

    env = gym.make(env_id)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        steps += 1
        if term or trunc:
            env.reset()
    rate = steps / (time.perf_counter() - t0)
    env.close()
    return rate


def parse_sf_log(text: str, launch: float) -> dict[str, list[float]]:
    """(seconds since launch, value) series of Sample Factory's reward and frame lines."""
    out: dict[str, list[float]] = {"t": [], "ret": [], "frames_t": [], "frames": []}
    for line in text.splitlines():
        stamp = _SF_STAMP.search(line)
        if stamp is None:
            continue
        when = dt.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - launch
        if (m := _SF_REWARD.search(line)) is not None:
            out["t"].append(when)
            out["ret"].append(float(m.group(1)))
        if (m := _SF_FRAMES.search(line)) is not None:
            out["frames_t"].append(when)
            out["frames"].append(float(m.group(1)))
    return out


def read_fastlight_events(root: Path, launch: float) -> dict[str, list[float]]:
    """(seconds since launch, value) of ``rollout/return`` and ``env_steps`` from TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[float]] = {"t": [], "ret": [], "frames_t": [], "frames": []}
    for events in sorted(root.glob("tb/version_*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags()["scalars"]
        if "rollout/return" in tags:
            for e in acc.Scalars("rollout/return"):
                out["t"].append(e.wall_time - launch)
                out["ret"].append(e.value)
        if "env_steps" in tags:
            for e in acc.Scalars("env_steps"):
                out["frames_t"].append(e.wall_time - launch)
                out["frames"].append(e.value)
    return out


def summarise(series: dict[str, list[float]], final_s: float, budget_s: float) -> dict[str, float]:
    """Final return (mean over the last ``final_s`` of the budget), first-report time, steps/s."""
    t, ret = np.asarray(series["t"]), np.asarray(series["ret"])
    keep = (t <= budget_s) & np.isfinite(ret)
    t, ret = t[keep], ret[keep]
    last = ret[t >= budget_s - final_s]
    ft, fr = np.asarray(series["frames_t"]), np.asarray(series["frames"])
    fk = ft <= budget_s
    ft, fr = ft[fk], fr[fk]
    sps = float((fr[-1] - fr[0]) / (ft[-1] - ft[0])) if len(fr) > 1 and ft[-1] > ft[0] else float("nan")
    return {
        "final_return": float(last.mean()) if len(last) else float("nan"),
        "first_report_s": float(t[0]) if len(t) else float("nan"),
        "env_steps_per_s": sps,
        "env_steps": float(fr[-1]) if len(fr) else float("nan"),
    }


def _run(cmd: list[str], *, seconds: float, log: Path, env: dict[str, str]) -> float:
    """Run ``cmd`` in its own process group for at most ``seconds`` (then SIGINT, SIGKILL); returns
    the launch time."""
    launch = time.time()
    with log.open("w") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True
        )
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return launch


def run_sf(env_id: str, seed: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    name = f"sf_{env_id}_{seed}"
    cmd = [
        args.sf_python, "-m", "sf_examples.mujoco.train_mujoco", "--env", SF_ENVS[env_id],
        "--experiment", name, "--train_dir", str(work), "--num_workers", "2", "--num_envs_per_worker", "8",
        "--device", "cpu", "--seed", str(seed),
    ]  # fmt: skip
    log = work / f"{name}.log"
    budget = 60 * args.minutes
    launch = _run(cmd, seconds=budget + 5, log=log, env={**os.environ, "MUJOCO_GL": "egl"})
    series = parse_sf_log(log.read_text(errors="replace"), launch)
    return {"system": "Sample Factory", "env": env_id, "seed": seed, "command": shlex.join(cmd),
            "series": series, **summarise(series, args.final_s, budget)}  # fmt: skip


def run_fastlight(env_id: str, seed: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    root = work / f"fastlight_{env_id}_{seed}"
    budget = 60 * args.minutes
    hms = time.strftime("%H:%M:%S", time.gmtime(budget))
    fastlight = str(Path(sys.executable).with_name("fastlight"))
    cmd = [
        fastlight, "fit", "--config", args.config, "--data.env_id", env_id,
        "--seed_everything", str(seed), "--trainer.max_time", f"00:{hms}",
        "--trainer.default_root_dir", str(root),
        *args.fastlight_args,
    ]  # fmt: skip
    launch = _run(cmd, seconds=budget + 60, log=work / f"fastlight_{env_id}_{seed}.log", env=dict(os.environ))
    series = read_fastlight_events(root, launch)
    return {"system": "fastlight", "env": env_id, "seed": seed, "command": shlex.join(cmd),
            "series": series, **summarise(series, args.final_s, budget)}  # fmt: skip


def report(
    rows: list[dict[str, Any]], ceilings: dict[str, float], args: argparse.Namespace, out: Path
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.mujoco " + shlex.join(args.argv)
    if args.earlier_command:
        command = f"{args.earlier_command}`, then `{command}"
    slim = [{k: v for k, v in r.items() if k != "series"} for r in rows]
    (out / "mujoco.json").write_text(
        json.dumps({"command": command, "ceilings": ceilings, "runs": rows}, indent=1)
    )
    lines = [
        RACE,
        "",
        f"Command: `{command}`",
        "",
        f"Each run {args.minutes:g} min from its process launch (start-up included), one at a time on "
        f"this machine ({os.cpu_count()} cores). Score: the mean training-episode return over the last "
        f"{args.final_s:g} s. Sample Factory 2.1.1 in its own virtualenv, its MuJoCo defaults, 2 workers x "
        f"8 envs, `--device cpu`; fastlight `{args.config}`. Plain-loop ceiling: one env, random "
        "actions, this process. In the plot, fastlight's curve is each Rollout's mean over its completed "
        "episodes (noisier), Sample Factory's its running mean over recent episodes; the scores average "
        "both over the same final window.",
        "",
        "| env | system | seeds | final return (mean ± s.d.) | per seed | env steps/s | first return (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for env_id in args.env:
        means = {}
        for system in ("Sample Factory", "fastlight"):
            got = [r for r in slim if r["env"] == env_id and r["system"] == system]
            if not got:
                continue
            finals = np.array([r["final_return"] for r in got])
            sps = np.array([r["env_steps_per_s"] for r in got])
            first = np.array([r["first_report_s"] for r in got])
            means[system] = float(np.nanmean(finals))
            lines.append(
                f"| {env_id} | {system} | {len(got)} | {np.nanmean(finals):.0f} ± {np.nanstd(finals):.0f} | "
                f"{', '.join(f'{x:.0f}' for x in finals)} | {np.nanmean(sps):,.0f} | "
                f"{np.nanmean(first):.0f} |"
            )
        lines.append(
            f"| {env_id} | plain-loop ceiling (1 env, 1 process) | | | | {ceilings[env_id]:,.0f} | |"
        )
        if len(means) == 2:
            ratio = means["fastlight"] / means["Sample Factory"] if means["Sample Factory"] else float("nan")
            verdict = "met" if means["fastlight"] >= means["Sample Factory"] else "MISSED"
            verdicts.append(
                f"- **{verdict}** {env_id}: fastlight's final return >= Sample Factory's: "
                f"{means['fastlight']:.0f} vs {means['Sample Factory']:.0f} ({ratio:.2f}x)"
            )
    lines += ["", "### Target", "", *verdicts, "", "![return vs wall-clock](mujoco.png)", ""]
    write_section(out / "mujoco.md", lines)
    _plot(rows, args, out / "mujoco.png")


TITLE = "# MuJoCo: learning per env step and per wall-clock second"
RACE = "## Learning per wall-clock second: fastlight vs Sample Factory"


def write_section(path: Path, lines: list[str]) -> None:
    """Put ``lines`` (a ``## `` heading first) into ``path`` in place of the section with that heading,
    or after the others; the other sections stay as they are."""
    heading = lines[0]
    sections: list[list[str]] = []
    if path.exists():
        for line in path.read_text().splitlines():
            if line.startswith("## ") or not sections:
                sections.append([])
            sections[-1].append(line)
    sections = [sec for sec in sections if sec and sec[0].startswith("## ")]
    body = [lines if sec[0] == heading else sec for sec in sections]
    if all(sec[0] != heading for sec in sections):
        body.append(lines)
    text = "\n".join([TITLE, ""] + ["\n".join(sec).rstrip("\n") + "\n" for sec in body])
    path.write_text(text)


def _plot(rows: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.env), figsize=(6 * len(args.env), 4), squeeze=False)
    colors = {"Sample Factory": "tab:orange", "fastlight": "tab:blue"}
    for ax, env_id in zip(axes[0], args.env, strict=True):
        labelled: set[str] = set()
        for r in rows:
            if r["env"] != env_id:
                continue
            s = r["series"]
            label = None if r["system"] in labelled else r["system"]
            labelled.add(r["system"])
            ax.plot(s["t"], s["ret"], color=colors[r["system"]], alpha=0.7, lw=1, label=label)
        ax.set_title(env_id)
        ax.set_xlabel("wall-clock since launch (s)")
        ax.set_ylabel("training-episode return")
        ax.set_xlim(0, 60 * args.minutes)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.mujoco", description=__doc__.split("\n")[0])
    envs = sorted(set(SF_ENVS) | set(env_steps.CLEANRL_1M))
    p.add_argument("--env", nargs="+", default=["Hopper-v4", "HalfCheetah-v4"], choices=envs)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--minutes", type=float, default=3.5, help="wall-clock per run, from launch")
    p.add_argument(
        "--final-s", type=float, default=20.0, help="the score averages the last this many seconds"
    )
    p.add_argument("--ceiling-s", type=float, default=10.0, help="seconds of the plain-loop measurement")
    p.add_argument(
        "--config",
        default=None,
        help="the fastlight config to run (default: configs/mujoco_ppo_fast.yaml for the race, "
        "configs/mujoco_ppo.yaml with --env-steps)",
    )
    p.add_argument(
        "--env-steps",
        type=int,
        default=None,
        help="stop each fastlight run at this many env steps and report return per env step beside CleanRL's "
        "published PPO (no Sample Factory runs); without it, the equal-wall-clock race",
    )
    p.add_argument(
        "--final-steps",
        type=float,
        default=20_000,
        help="with --env-steps: the score averages the last this many env steps",
    )
    p.add_argument(
        "--eval-every-steps",
        type=float,
        default=50_000,
        help="with --env-steps: a deterministic evaluation (PeriodicEvaluation) every ~this many env steps",
    )
    p.add_argument("--eval-episodes", type=int, default=10, help="with --env-steps: episodes per evaluation")
    p.add_argument("--sf-python", default=None, help="python of a virtualenv with sample-factory==2.1.1")
    p.add_argument("--systems", nargs="+", default=["sf", "fastlight"], choices=["sf", "fastlight"])
    p.add_argument("--fastlight-args", nargs=argparse.REMAINDER, default=[], help="appended to fastlight fit")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--add-to", type=Path, default=None, help="an earlier mujoco.json whose runs to keep")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.env_steps is not None:
        if args.env_steps < 1:
            p.error(f"--env-steps must be >= 1, got {args.env_steps}")
        args.systems = ["fastlight"]
    if args.config is None:
        args.config = RACE_CONFIG if args.env_steps is None else ENV_STEPS_CONFIG
    no_sf = [e for e in args.env if e not in SF_ENVS]
    if "sf" in args.systems and no_sf:
        p.error(f"--env {' '.join(no_sf)}: not a Sample Factory env; use --env-steps or --systems fastlight")
    if "sf" in args.systems and (args.sf_python is None or shutil.which(args.sf_python) is None):
        p.error(
            "--sf-python must name the python of a virtualenv with sample-factory==2.1.1 "
            "(or --systems fastlight)"
        )
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    rows: list[dict[str, Any]] = []
    args.earlier_command = None
    if args.add_to is not None:
        # mujoco.json, or mujoco_env_steps.json with --env-steps
        earlier = json.loads(args.add_to.read_text())
        rows = [r for r in earlier["runs"] if r["env"] in args.env]
        args.earlier_command = earlier["command"]
        taken = {(r["env"], r["system"], r["seed"]) for r in rows}
        names = {"sf": "Sample Factory", "fastlight": "fastlight"}
        again = [(e, names[s], seed) for e in args.env for s in args.systems for seed in args.seeds]
        if taken & set(again):
            raise SystemExit(f"--add-to {args.add_to} already has runs {sorted(taken & set(again))}; "
                             "choose other --seeds")  # fmt: skip
    os.environ.setdefault("MUJOCO_GL", "egl")
    work = Path(tempfile.mkdtemp(prefix="fastlight-mujoco-"))
    if args.env_steps is not None:
        for env_id in args.env:
            for seed in args.seeds:
                rows.append(env_steps.run(env_id, seed, args, work, _run))
                r = rows[-1]
                print(f"{env_id} seed {seed}: return {r['final_return']:.0f} at {r['env_steps']:,.0f} "
                      f"env steps, {r['seconds'] / 60:.1f} min; deterministic eval: final "
                      f"{r['final_eval']:.0f}, best {r['best_eval']:.0f}",
                      file=sys.stderr, flush=True)  # fmt: skip
        command = "python -m benchmarks.mujoco " + shlex.join(args.argv)
        if args.earlier_command:
            command = f"{args.earlier_command}`, then `{command}"
        write_section(args.out / "mujoco.md", env_steps.report(rows, args, args.out, command))
        print(f"wrote {args.out / 'mujoco.md'} (runs under {work})", file=sys.stderr)
        return
    ceilings = {env_id: plain_loop_sps(env_id, args.ceiling_s, 0) for env_id in args.env}
    for env_id in args.env:
        for seed in args.seeds:
            # Alternate which system goes first, so a drift in machine speed hits both alike.
            order = ["sf", "fastlight"] if seed % 2 == 0 else ["fastlight", "sf"]
            for system in order:
                if system not in args.systems:
                    continue
                run = run_sf if system == "sf" else run_fastlight
                rows.append(run(env_id, seed, args, work))
                r = rows[-1]
                print(f"{env_id} seed {seed} {r['system']}: final return {r['final_return']:.0f}, "
                      f"{r['env_steps_per_s']:,.0f} env steps/s", file=sys.stderr, flush=True)  # fmt: skip
    report(rows, ceilings, args, args.out)
    print(f"wrote {args.out / 'mujoco.md'} (runs under {work})", file=sys.stderr)


if __name__ == "__main__":
    main()
