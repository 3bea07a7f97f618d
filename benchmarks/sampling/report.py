"""Outputs of the sampling benchmark: ``sampling.json`` (rows), ``sampling.png`` (effective
throughput against clip count, one line per mode) and ``sampling.md`` (tables, the exact
command, the emulation model, a time profile, and the targets with met/missed and why)."""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.sampling.targets import analysis_lines, target_lines
from fastlight.extras import check_extra

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Row = dict[str, Any]

TITLES = {
    "native": "(a) real stepping, the environment's own reset",
    "emulated_reset": "(b) real stepping, emulated scenario load on every env reset",
    "shared_sim": "(c) shared simulator (FAST's setting), fully emulated",
}


def label(row: Row) -> str:
    return f"dpsa@{row['threshold']:g}" if row["mode"] == "dpsa" else row["mode"]


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _busy(r: Row) -> float:
    return r["wall_s"] / max(r["workers"] * r["elapsed_s"], 1e-9)


def _table(rows: list[Row]) -> list[str]:
    procs = rows[0].get("path") == "procs"
    out = [
        "| mode | clips " + ("| procs | busy " if procs else "")
        + "| raw tps | effective tps | sample eff. | time eff. | mean ep. len (± s.e.) "
        "| trunc. share | resets / 1k valid | speed-up vs sequential |",
        "|---|---:" + ("|---:|---:" if procs else "") + "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        same = " †" if r["same_as"] else ""
        extra = f" | {r['workers']} | {_busy(r):.2f}" if procs else ""
        out.append(
            f"| {label(r)}{same} | {r['clips']}{extra} | {r['raw_tps']:.1f} | {r['effective_tps']:.1f} "
            f"| {r['sample_efficiency']:.3f} | {r['time_efficiency']:.3f} "
            f"| {_f(r['mean_episode_length'])} ± {_f(r['mean_episode_length_se'])} "
            f"| {_f(r['truncated_episode_share'])} | {r['resets_per_1k_valid']:.1f} "
            f"| {r['speedup_vs_sequential']:.2f}× |"
        )
    return out


def _profile(rows: list[Row]) -> list[str]:
    out = [
        "| mode | clips | step s / 1k valid | reset s / 1k valid | other s / 1k valid | total s / 1k valid "
        "| valid per global reset |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["same_as"]:
            continue
        k = 1000.0 / max(r["valid_steps"], 1)
        cycles = r["mode"] in ("sgr", "dpsa")  # autoreset modes reset envs one by one
        per_reset = r["valid_steps"] / r["global_resets"] if cycles and r["global_resets"] else math.nan
        out.append(
            f"| {label(r)} | {r['clips']} | {r['step_s'] * k:.2f} | {r['reset_s'] * k:.2f} "
            f"| {r['other_s'] * k:.2f} | {r['wall_s'] * k:.2f} | {_f(per_reset, '.1f')} |"
        )
    return out


def _pool_line(pool: list[list[int] | tuple[int, bool]]) -> str:
    if not pool:
        return "no complete episodes measured"
    lengths = np.asarray([p[0] for p in pool], dtype=float)
    term = np.mean([bool(p[1]) for p in pool])
    p10, p50, p90 = np.percentile(lengths, [10, 50, 90])
    return (f"{len(pool)} complete episodes, length mean {lengths.mean():.1f}, p10/p50/p90 "
            f"{p10:.0f}/{p50:.0f}/{p90:.0f}, max {lengths.max():.0f}; {term:.0%} terminated "
            f"(crash), {1 - term:.0%} hit the time limit")


def _load(avg: tuple[float, ...] | list[float]) -> str:
    return "/".join(f"{x:.1f}" for x in avg)


def _load_warning(rows: list[Row]) -> list[str]:
    """Flag a table whose real step time moved between cells (other jobs on the machine)."""
    if rows[0]["setting"] == "shared_sim":
        return []
    ms = [1e3 * r["step_s"] / max(r["valid_steps"], 1) for r in rows if not r["same_as"]]
    if max(ms) <= 1.25 * min(ms):
        return [f"Real step time across cells: {min(ms):.1f}-{max(ms):.1f} ms (steady).", ""]
    return [f"**Warning: machine load varied during this table** - one real env step cost between "
            f"{min(ms):.1f} and {max(ms):.1f} ms across cells (see the profile), so ratios between "
            "cells carry that error.", ""]


def _procs_model_lines(meta: dict[str, Any]) -> list[str]:
    r, w = meta["reset_cost_s"], meta["workers"]
    return [
        "## What is measured",
        "",
        "- **Path**: fastlight's own sampling path, the one `fastlight fit` uses: a `RolloutDataModule` "
        f"spawns its sampler processes ({w} here, one per core by default; `sequential` is one env in "
        "one process, and no mode gets more processes than clips), each steps its share of the clips "
        "with a Collector and sends one Rollout per round; the trainer side takes one super-batch "
        "(one item per sampler) per step and publishes a new policy version, so the samplers run "
        "strictly on-policy, as in training. Rates are valid transitions over the trainer-side wall "
        "clock between batches; the first batch of each cell (process start, first resets) is not "
        "counted.",
        "- **Policy**: a fixed random policy sampling the env's own action space (no network, no "
        f"update), so the runs measure sampling only. Episodes here: {_pool_line(meta['episode_pool'])}.",
        f"- **native**: real `{meta['env']}` stepping and resets. **emulated_reset**: as native, and "
        f"every env reset also sleeps {r:g} s (`ScenarioLoadCost`, an I/O-bound scenario load); the "
        "resets of one sampler overlap on its thread pool.",
        "- Episode lengths: in `dpsa`/`sgr` every trajectory the learner receives (cut ones at their cut "
        "length); in `sequential`/`autoreset` the episodes that ended while measuring (the few still "
        "running when a cell stops are not counted, a bias of well under one episode per env).",
        "- `time eff.` is per sampler (its env-step time over its busy time); `busy` is the samplers' "
        "busy time over (processes × wall clock): the rest is each sampler waiting for the slowest "
        "one's item and the next policy version (the on-policy barrier).",
        "- † at 1 clip, `autoreset` runs the same code as `sequential`, and `dpsa` at any threshold "
        "in (0, 1] the same as `sgr`: measured once.",
        "",
    ]


def _model_lines(meta: dict[str, Any]) -> list[str]:
    if meta.get("path") == "procs":
        return _procs_model_lines(meta)
    r, s = meta["reset_cost_s"], meta["shared_step_s"]
    return [
        "## What is real and what is emulated",
        "",
        f"- **Policy**: a fixed uniform-random policy over the discrete actions (no network), so the "
        f"runs measure sampling only. Episodes here: {_pool_line(meta['episode_pool'])}.",
        f"- **(a) native**: real `{meta['env']}` stepping and resets on this machine, one process: "
        "the Collector steps its envs one after another (pure-Python simulator, one core).",
        f"- **(b) emulated_reset**: as (a), and every env reset also sleeps {r:g} s "
        "(`ScenarioLoadCost`, an I/O-bound scenario load). The resets of one sampler happen on a "
        "thread pool, so a global reset of N envs costs about one load, not N.",
        f"- **(c) shared_sim**: FAST's setting, emulated (`benchmarks/sampling/shared_sim.py`). All clips "
        f"live in one simulator; only a global reset exists and it reloads the clips one after another "
        f"({r:g} s each, so N × {r:g} s); one simulator tick steps all clips in parallel, as on "
        f"FAST's 8-GPU node, and costs a fixed {s * 1000:.1f} ms (the issue's model: a {r:g} s "
        f"reset ≈ {r / s if s > 0 else math.inf:.0f}× a step; fixed so that machine load cannot move "
        "it). Episode lengths are replayed from the complete episodes of the first real setting. "
        "`sequential` is one clip in its own simulator. `autoreset` does not exist there.",
        "- Every cell collects the same number of valid transitions (whole cycles, so up to one "
        "cycle more); speed-ups are effective-throughput ratios against `sequential` in the same "
        "setting and the same invocation, rounds interleaved.",
        "- † at 1 clip, `autoreset` runs the same code as `sequential`, and `dpsa` at any threshold "
        "in (0, 1] the same as `sgr` (the cycle ends at the first termination): measured once.",
        "",
    ]


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    lines = [
        "# Sampling benchmark: sequential vs SGR vs autoreset vs DPSA (FAST)",
        "",
        "Produced by:",
        "",
        "```",
        meta["command"],
        "```",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores visible, "
        f"Python {platform.python_version()}. Path: `{meta.get('path', 'single')}`. Valid transitions "
        f"per cell: {meta['valid_steps']} over "
        f"{meta['rounds']} interleaved round(s); seed {meta['seed']}; total time {meta['total_s']:.0f} s. "
        f"Load average (1/5/15 min) before: {_load(meta['load_before'])}, "
        f"after: {_load(meta['load_after'])}.",
        "",
        *_model_lines(meta),
    ]
    for setting, title in TITLES.items():
        part = [r for r in rows if r["setting"] == setting]
        if not part:
            continue
        lines += [f"## {title}", "", *_load_warning(part), *_table(part), "",
                  "Time profile (seconds per 1,000 valid transitions"
                  + (", sampler-seconds summed over processes" if meta.get("path") == "procs" else "")
                  + "):", "", *_profile(part), ""]
    lines += ["## Targets", "", *target_lines(rows), "", "## Why (from the profile)", "",
              *analysis_lines(rows, meta), ""]
    return "\n".join(lines)


def _color(name: str) -> str:
    """One colour per mode, the same in every panel."""
    fixed = {"sgr": "tab:blue", "autoreset": "tab:orange", "dpsa@0.5": "tab:green",
             "dpsa@0.75": "tab:red", "dpsa@1": "tab:purple"}
    return fixed.get(name, "tab:gray")


def plot(rows: list[Row], path: Path) -> Figure:
    """Save one panel per setting, effective throughput against clips; returns the (closed) Figure."""
    check_extra("matplotlib", extra="bench", what="python -m benchmarks.sampling (its plot)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = [s for s in TITLES if any(r["setting"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4.2), squeeze=False)
    for ax, setting in zip(axes[0], settings, strict=True):
        part = [r for r in rows if r["setting"] == setting]
        clips = sorted({r["clips"] for r in part})
        for name in dict.fromkeys(label(r) for r in part):
            if name == "sequential":
                seq = next(r for r in part if r["mode"] == "sequential")
                ax.axhline(seq["effective_tps"], color="black", ls="--", label="sequential")
                continue
            pts = sorted((r["clips"], r["effective_tps"]) for r in part if label(r) == name)
            ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=name, color=_color(name))
        ax.set_ylim(bottom=0)
        ax.set_xticks(clips)
        ax.set_xlabel("parallel clips")
        ax.set_ylabel("effective throughput (valid transitions / s)")
        ax.set_title(TITLES[setting], fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def write_outputs(rows: list[Row], meta: dict[str, Any], out: Path) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sampling.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, out / "sampling.png")
    (out / "sampling.md").write_text(markdown(rows, meta))
