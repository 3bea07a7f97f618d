"""Where a VLA's gain comes from: four arms from one SFT checkpoint, at equal wall-clock, several seeds.

    python -m benchmarks.vla.ablation --sft runs/sft/checkpoints/last.ckpt --tasks push-v3 \\
        --minutes 20 --seeds 0 1 2 --out benchmarks/results/vla_ablation_push

From the same supervised (one-demo) checkpoint, each arm trains for ``--minutes`` of wall-clock per
training seed:

- ``sft_continued``: supervised fine-tuning continued on the same demonstrations
  (``configs/vla_metaworld_mt10_sft.yaml``);
- ``sil_only``: the RL config's rollouts and self-imitation steps, with the policy-gradient steps at a
  learning rate of 1e-30 (they move nothing; the critic and the self-imitation optimizer still learn);
- ``rl_only``: the RL config without self-imitation (``--model.sil_steps 0``);
- ``rl_sil``: the RL config as shipped (RL + self-imitation).

The RL arms run ``configs/vla_metaworld_mt10.yaml`` with ``--tasks`` (and without its Dynamic Weighted
Resampling when one task is given: one task has nothing to re-weight) plus every ``--rl-flag``; the
flags of the SFT stage that made ``--sft`` (``--sft-flag``, e.g. ``--model.bin_sigma 16``) are given to
``sft_continued``. Runs whose ``last.ckpt`` exists are not run again, so an interrupted ablation
continues where it stopped. Then every final checkpoint and the start play the same greedy episodes
(:mod:`benchmarks.vla.eval`, ``--episodes-per-task`` on the shared evaluation seed), and the report
gives each arm's success pooled over its seeds, the paired difference against ``sft_continued`` (a
bootstrap over episode indices within each task, shared by every arm and seed, so it holds the
evaluation noise; the per-seed values show the training-seed spread), per task and for the mean.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.vla import eval as vla_eval

COMMAND = "python -m benchmarks.vla.ablation"
ROOT = Path(__file__).resolve().parents[2]
ARMS = ("sft_continued", "sil_only", "rl_only", "rl_sil")
ARM_FLAGS = {
    "sil_only": ["--model.lr", "1e-30"],
    "rl_only": ["--model.sil_steps", "0"],
    "rl_sil": [],
}


def rl_config(tasks: str, folder: Path) -> Path:
    """The shipped MT10 RL config for ``tasks``: without its DWR callback when there is one task."""
    text = (ROOT / "configs/vla_metaworld_mt10.yaml").read_text()
    text = text.replace("tasks: MT10", f"tasks: {tasks}")
    if "," not in tasks and tasks != "MT10":
        text, n = re.subn(
            r"    - class_path: fastlight.DynamicWeightedResampling\n(?:      .*\n|        .*\n)+", "", text
        )
        if n != 1:
            raise SystemExit(f"{COMMAND}: could not find the DWR callback in configs/vla_metaworld_mt10.yaml")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rl_config.yaml"
    path.write_text(text)
    return path


def arm_command(arm: str, args: argparse.Namespace, seed: int, root: Path, config: Path) -> list[str]:
    """The ``fastlight fit`` command line of one arm and training seed."""
    clock = ["--trainer.max_time", f"00:00:{args.minutes:02d}:00", "--trainer.max_steps", "10000000"]
    common = [
        "--seed_everything",
        str(seed),
        "--model.init_from",
        args.sft,
        "--trainer.default_root_dir",
        str(root),
    ]
    fit = [sys.executable, "-m", "fastlight", "fit"]
    if arm == "sft_continued":
        config_flags = ["--config", str(ROOT / "configs/vla_metaworld_mt10_sft.yaml")]
        env = ["--data.env_kwargs.tasks", args.tasks, "--data.demos_per_task", str(args.demos_per_task)]
        return [*fit, *config_flags, *env, *common, *clock, *args.sft_flag]
    return [*fit, "--config", str(config), *common, *clock, *ARM_FLAGS[arm], *args.rl_flag]


def pooled(
    episodes: list[dict[str, Any]], labels: dict[str, list[str]], tasks: list[str]
) -> dict[str, np.ndarray]:
    """Success ``[S, T, E]`` of each arm (its seeds' labels) from the evaluation's episode records."""
    out = {}
    for arm, names in labels.items():
        cells = [
            [[e["success"] for e in episodes if e["policy"] == n and e["task"] == t] for t in tasks]
            for n in names
        ]
        out[arm] = np.asarray(cells, dtype=float)
    return out


def paired_ci(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int = 0) -> tuple[float, float, float]:
    """Mean over tasks of ``b - a`` (each pooled over its seeds), and a 95% bootstrap interval resampling
    episode indices within each task, the same indices for both (they played the same seeds)."""
    rng = np.random.default_rng(seed)
    n_ep = a.shape[-1]
    diff = b.mean(0) - a.mean(0)  # [T, E]: pooled over seeds, paired by episode
    idx = rng.integers(0, n_ep, size=(n_boot, diff.shape[0], n_ep))
    boots = np.take_along_axis(np.broadcast_to(diff, (n_boot, *diff.shape)), idx, axis=-1).mean(axis=(1, 2))
    return float(diff.mean()), float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


def report(result: dict[str, Any], tasks: list[str], arms: list[str], seeds: list[int], n_boot: int) -> str:
    labels = {"sft_start": ["sft_start"], **{a: [f"{a}-s{s}" for s in seeds] for a in arms}}
    succ = pooled(result["episodes"], labels, tasks)
    base = succ.get("sft_continued")
    lines = [
        "| arm | seeds | mean success | per seed | per task | - sft_continued [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    for arm, s in succ.items():
        per_seed = ", ".join(f"{v:.2f}" for v in s.mean(axis=(1, 2)))
        per_task = ", ".join(
            f"{t.removesuffix('-v3')} {v:.2f}" for t, v in zip(tasks, s.mean(axis=(0, 2)), strict=True)
        )
        diff = "-"
        if base is not None and arm != "sft_continued":
            d, lo, hi = paired_ci(base, s, n_boot)
            diff = f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        lines.append(f"| {arm} | {s.shape[0]} | {s.mean():.3f} | {per_seed} | {per_task} | {diff} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sft", required=True, help="the supervised checkpoint every arm starts from")
    p.add_argument(
        "--tasks", default="MT10", help="Meta-World tasks: MT10, one task or a comma-separated list"
    )
    p.add_argument("--demos-per-task", type=int, default=1, help="the demonstrations sft_continued trains on")
    p.add_argument("--minutes", type=int, default=60, help="wall-clock minutes of training per arm and seed")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument(
        "--rl-flag", action="append", default=[], help="a flag for the RL arms (repeatable; '--x=v')"
    )
    p.add_argument(
        "--sft-flag", action="append", default=[], help="a flag for sft_continued (repeatable; '--x=v')"
    )
    p.add_argument("--parallel", type=int, default=1, help="training runs at once (they share the cores)")
    p.add_argument("--episodes-per-task", type=int, default=20)
    p.add_argument("--n-boot", type=int, default=10_000)
    p.add_argument("--runs", default="runs/vla_ablation", help="folder of the training runs")
    p.add_argument("--out", default="benchmarks/results/vla_ablation", help="writes <out>.md and <out>.json")
    args = p.parse_args(argv)
    if args.minutes < 1 or args.parallel < 1:
        p.error(f"--minutes and --parallel must be >= 1, got {args.minutes} and {args.parallel}")
    runs = Path(args.runs)
    config = rl_config(args.tasks, runs)
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    commands, ckpts, todo = {}, [f"sft_start={args.sft}"], []
    for seed in args.seeds:
        for arm in args.arms:
            root = runs / arm / f"seed{seed}"
            cmd = arm_command(arm, args, seed, root, config)
            commands[f"{arm}-s{seed}"] = " ".join(cmd[1:])
            ckpts.append(f"{arm}-s{seed}={root / 'checkpoints' / 'last.ckpt'}")
            if not (root / "checkpoints" / "last.ckpt").exists():
                todo.append((f"{arm}-s{seed}", cmd, root))
    # --parallel runs at once share the machine alike, so every arm still gets equal compute.
    for i in range(0, len(todo), args.parallel):
        batch = todo[i : i + args.parallel]
        procs = []
        try:
            for name, cmd, root in batch:
                print(f"{COMMAND}: {name} for {args.minutes} min -> {root}", flush=True)
                log = open(runs / f"{name}.log", "w")  # noqa: SIM115 - closed below, after the run
                procs.append(
                    (name, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log, root)
                )
            for name, proc, log, root in procs:
                rc = proc.wait()
                log.close()
                if rc != 0 or not (root / "checkpoints" / "last.ckpt").exists():
                    raise SystemExit(f"{COMMAND}: {name} failed (rc {rc}); see {log.name}")
                print(f"{COMMAND}: {name} done", flush=True)
        finally:  # a failed arm or Ctrl-C: the arms still running stop too (SIGTERM: they save and exit)
            for _, proc, log, _ in procs:
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait()
                log.close()
    eval_args = [f"--ckpt={c}" for c in ckpts] + [
        "--episodes-per-task", str(args.episodes_per_task), "--batch", "10", "--out", f"{args.out}_eval",
        "--title", f"Ablation from one SFT checkpoint, {args.minutes} min per arm",
        "--n-boot", str(args.n_boot),
    ]  # fmt: skip
    result = vla_eval.main(eval_args)
    tasks = list(result["task_names"])
    table = report(result, tasks, args.arms, args.seeds, args.n_boot)
    text = "\n".join([
        f"# Ablation from one SFT checkpoint: {args.tasks}, {args.minutes} min per arm, seeds {args.seeds}",
        "",
        f"`{COMMAND} {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
        "Greedy success, pooled over training seeds; the interval is the paired bootstrap over evaluation",
        f"episodes ({args.episodes_per_task} per task, the same seeds for every policy).", "", table, "",
        "## Commands", "", *[f"- `{k}`: `fastlight {v.split(' ', 2)[-1]}`" for k, v in commands.items()], "",
    ])  # fmt: skip
    Path(f"{args.out}.md").write_text(text)
    Path(f"{args.out}.json").write_text(json.dumps({"commands": commands, "table": table}, indent=1))
    print(text)
    return {"table": table, "commands": commands}


if __name__ == "__main__":
    main()
