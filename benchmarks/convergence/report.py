"""The convergence benchmark's report: the Markdown tables, the targets' verdicts and the plot of
return against training wall-clock (:mod:`benchmarks.convergence` runs the bench and calls
these with its summary)."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

EVAL_SEED = 100_000  # a seed stream apart from the training envs' (seed + 10_000 r + 1_000 w)
SB3_LABEL = "sb3-ppo"  # benchmarks.convergence.sb3.LABEL, without importing SB3


def _ci(x: Sequence[float], fmt: str = ".1f", unit: str = "") -> str:
    point, lo, hi = x
    if math.isnan(point):
        return "n/a"
    f = lambda v: "never" if math.isinf(v) else format(v, fmt) + unit  # noqa: E731
    return f"{f(point)} [{f(lo)}, {f(hi)}]"


def _speedup(row: dict[str, Any], base: str) -> str:
    ci = row.get(f"speedup_vs_{base}", (math.nan,) * 3)
    return row.get(f"speedup_vs_{base}_bound", "") + _ci(ci, ".2f", "×")


def target_lines(s: dict[str, Any]) -> list[str]:
    m = s["modes"]
    out = []
    for d in [k for k in m if k.startswith("dpsa")]:
        for base, need in (("sequential", 1.5), ("sgr", 1.2)):
            key = f"speedup_vs_{base}"
            if base not in m or key not in m[d]:
                continue
            point, bound = m[d][key][0], m[d][f"{key}_bound"]
            ok = None if math.isnan(point) or (bound == "<=" and point >= need) else point >= need
            tag = "not judged" if ok is None else ("**met**" if ok else "**MISSED**")
            out.append(
                f"- {tag}: {d} reaches the target ≥ {need}× sooner than {base} — {bound}"
                f"{_ci(m[d][key], '.2f', '×')}" + (" (censored at the budget)" if bound else "")
            )
        if "sequential" in m and "final_minus_sequential" in m[d]:
            point, lo, hi = m[d]["final_minus_sequential"]
            ok = hi >= 0
            out.append(
                f"- {'**met**' if ok else '**MISSED**'}: {d}'s final return not worse than sequential's "
                f"(CI of the difference covers zero or favours it) — {_ci((point, lo, hi), '+.2f')}"
            )
    race = s.get("peer_race", {}).get(SB3_LABEL)
    if race is None:
        out.append(
            "- not run: fastlight reaches SB3's final return sooner than SB3 does (no SB3 run, see below)"
        )
    else:
        out.append(sb3_race_line(race))
    return out


def sb3_race_line(race: dict[str, Any]) -> str:
    """The issue's peer target as one line: the best mode's time to SB3's final mean return vs SB3's."""
    tag = "not judged" if race["met"] is None else ("**met**" if race["met"] else "**MISSED**")
    bound = race["bound"]
    return (
        f"- {tag}: fastlight reaches SB3's final return ({race['peer_final']:.2f}) sooner than SB3 does — "
        f"best mode {race['best_mode']} after {_ci(race['best_time'])} s, "
        f"SB3 after {_ci(race['peer_time'])} s "
        f"(speed-up {bound}{_ci(race['speedup'], '.2f', '×')}"
        + (", censored at the budget" if bound else "")
        + ")"
    )


def markdown(runs: list[dict[str, Any]], s: dict[str, Any], meta: dict[str, Any]) -> str:
    label = "QUICK (preliminary: 1 seed, short budget) " if meta["quick"] else ""
    lines = [
        f"# {label}Convergence by reset mode: PPO + SMPO on `{meta['env']}` (FAST)",
        "",
        "Produced by:",
        "",
        "```",
        meta["command"],
        "```",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores visible; load average (1/5/15 min) "
        f"before {meta['load_before']}, after {meta['load_after']} (the runs' own processes included; "
        f"any other job on the cores would slow every rate here). Python {platform.python_version()}; total "
        f"time {meta['total_s']:.0f} s.",
        "",
        "## Setting",
        "",
        f"- Each run: `RolloutDataModule` ({meta['clips']} clips over {meta['workers']} sampler processes; "
        "`sequential` is 1 clip in 1 process) + `RLModule` (PPO + SMPO, "
        f"{', '.join(f'{k}={v}' for k, v in meta['model'].items())}) + Lightning's `Trainer`, in a fresh "
        f"process, for {meta['budget_s']:g} s of training wall-clock.",
        f"- Same data per update: at least {meta['valid_steps_per_update']} valid transitions "
        "(`--data.valid_steps_per_step` for dpsa / sgr; one round of `rollout_steps` = budget / clips "
        "per env for autoreset / sequential).",
        f"- Scenario load: {meta['scenario_load_cost_s']:g} s emulated per env reset (`ScenarioLoadCost`)"
        + (" (native resets)" if meta["scenario_load_cost_s"] == 0 else "")
        + ".",
        f"- Evaluation: a snapshot every {meta['eval_every_s']:g} s of training (snapshot time excluded); "
        f"afterwards each plays {meta['eval_episodes']} fixed seeds ({EVAL_SEED}...) to their natural "
        "end, "
        + ("argmax actions" if meta.get("greedy") else "sampled actions (torch reseeded per snapshot)")
        + ", native resets; the curve is mean return vs training time.",
        f"- Target: {meta['target_frac']:g} × the best final mean return across modes = "
        f"{s['target']:.2f}. Intervals: 95% percentile bootstrap over seeds (one seed: a point, no "
        "spread); `never` = not reached within the budget.",
        f"- Raw ceiling of this machine: {os.cpu_count()} cores / {meta['step_s'] * 1e3:.1f} ms per real "
        f"`env.step` = {meta['raw_ceiling_tps']:.0f} transitions/s.",
        *_peer_setting(meta),
        "",
        "## By mode",
        "",
        "| mode | seeds | updates | valid / update | effective tps | final return | time to target (s) "
        "| speed-up vs sequential | speed-up vs sgr |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m, row in s["modes"].items():
        lines.append(
            f"| {m} | {row['seeds']} | {row['updates']:.0f} | {row['valid_per_update']:.0f} "
            f"| {row['effective_tps']:.1f} | {_ci(row['final_return'], '.2f')} "
            f"| {_ci(row['time_to_target'])} "
            f"| {_speedup(row, 'sequential')} | {_speedup(row, 'sgr')} |"
        )
    if SB3_LABEL not in s["modes"]:
        lines += [
            "| SB3 PPO (peer) | - | - | - | - | not run | not run | - | - |",
            "",
            f"SB3 peer row not run: {meta['sb3']}",
        ]
    lines += [
        "",
        "## Runs",
        "",
        "| mode | seed | updates | valid steps | valid / update | train s | effective tps | final return "
        "| time to target (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        ttt = "never" if math.isinf(r["time_to_target"]) else f"{r['time_to_target']:.0f}"
        lines.append(
            f"| {r['label']} | {r['seed']} | {r['updates']} | {r['valid_steps']} "
            f"| {r['valid_per_update']:.0f} "
            f"| {r['train_s']:.0f} | {r['effective_tps']:.1f} | {r['curve'][-1]['return']:.2f} | {ttt} |"
        )
    lines += [
        "",
        "## Targets (benchmark, not test)",
        "",
        *target_lines(s),
        "",
        "![return vs training wall-clock](convergence.png)",
        "",
    ]
    return "\n".join(lines)


def _peer_setting(meta: dict[str, Any]) -> list[str]:
    sb3 = meta.get("sb3_run")
    if not sb3:
        return []
    recipe = ", ".join(f"{k}={v}" for k, v in sb3["model"].items() if k != "policy_kwargs")
    return [
        f"- Peer `{SB3_LABEL}` (own row and curve; not counted in the target): Stable-Baselines3 PPO with "
        f"highway-env's recipe (`MlpPolicy`, net_arch pi=[256, 256], vf=[256, 256], {recipe}; SB3's "
        f"other defaults) on the same env and scenario load, in a `SubprocVecEnv` of {sb3['num_envs']} envs "
        f"= {sb3['num_envs']} processes (SubprocVecEnv runs one process per env; the peer keeps "
        "fastlight's env count rather than one env per core, so an update sees as many independent "
        "episodes and the emulated loads overlap across processes), n_steps = "
        f"ceil({meta['valid_steps_per_update']} / {sb3['num_envs']}) = {sb3['n_steps']} per env, i.e. "
        f"{sb3['n_steps'] * sb3['num_envs']} transitions per update (every one valid: SB3 auto-resets "
        "each env). Same budget, snapshot clock (start-up excluded) and evaluation (`model.predict`; "
        "torch reseeded per snapshot).",
    ]


def plot(
    runs: list[dict[str, Any]], modes: Sequence[str], target: float, path: Path, peers: Sequence[str] = ()
) -> None:
    """Mean evaluation return vs training wall-clock per mode (peers dashed), band = min..max over seeds."""
    from fastlight.extras import check_extra

    check_extra("matplotlib", extra="bench", what="python -m benchmarks.convergence (its plot)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in [*modes, *peers]:
        mine = [r for r in runs if r["label"] == m]
        if not mine:
            continue
        grid = np.unique(np.concatenate([[c["t"] for c in r["curve"]] for r in mine]))
        # Each run's return at t: its latest snapshot at or before t (a step function).
        vals = np.array([[_at(r["curve"], t) for t in grid] for r in mine])
        (line,) = ax.plot(
            grid,
            np.nanmean(vals, axis=0),
            label=f"{m} ({len(mine)} seed(s))",
            drawstyle="steps-post",
            ls="--" if m in peers else "-",
        )
        if len(mine) > 1:
            ax.fill_between(
                grid,
                np.nanmin(vals, axis=0),
                np.nanmax(vals, axis=0),
                color=line.get_color(),
                alpha=0.2,
                step="post",
            )
    ax.axhline(target, color="black", ls=":", label="target")
    ax.set_xlabel("training wall-clock (s, evaluation excluded)")
    ax.set_ylabel("evaluation return (natural episode end)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _at(curve: list[dict[str, float]], t: float) -> float:
    before = [c["return"] for c in curve if c["t"] <= t]
    return before[-1] if before else math.nan
