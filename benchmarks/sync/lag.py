"""Policy lag of the asynchronous highway run, with its effective throughput, side by side.

    python -m benchmarks.sync.lag --rounds 2 --minutes 4
    python -m benchmarks.sync.lag --variants 'before=--data.rank_rounds=apart' 'cut='

Each variant is one real ``fastlight fit --config configs/highway_dpsa.yaml --data.inference '{}'
--data.max_staleness 1 --data.prefetch 2 --trainer.callbacks+ WeightSync`` of ``--minutes``
(sync.md's Run 4 command), plus its overrides; variants alternate within each round and their
order flips between rounds, so both see the same machine. From each run's ``metrics.csv``, one
row per update:

- ``rollout/policy_lag``: the mean over the batch's valid steps of (trainer version - behaviour
  version); reported as the mean over updates (as Run 4) and weighted by the batch's valid steps;
- ``perf/effective_tps`` (valid steps per second of trainer wall clock, ``RolloutThroughput``),
  its mean over updates, and the valid steps consumed in the whole run (same length, same
  start-up): a lag of 0 bought by idle samplers would show here;
- ``rollout/cut_in_flight``: rounds cut for the batch (``--data.rank_rounds``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Run 4's command in sync.md (without its --trainer.max_time and root).
BASE = [
    "--config", "configs/highway_dpsa.yaml", "--data.inference={}", "--data.max_staleness=1",
    "--data.prefetch=2", "--trainer.callbacks+=fastlight.callbacks.weight_sync.WeightSync",
    "--trainer.enable_progress_bar=false", "--trainer.max_steps=-1",
]  # fmt: skip
TARGET_LAG = 0.1
TARGET_TPS_LOSS = 0.05


def read_updates(metrics: Path) -> list[dict[str, float]]:
    """One dict per update (a ``rollout/policy_lag`` row) of a run's ``metrics.csv``."""
    keys = ("rollout/policy_lag", "rollout/valid_steps", "perf/effective_tps", "rollout/cut_in_flight")
    with open(metrics) as f:
        rows = [r for r in csv.DictReader(f) if r.get("rollout/policy_lag")]
    return [{k: float(r[k]) for k in keys if r.get(k)} for r in rows]


def summarise(updates: list[dict[str, float]]) -> dict[str, float]:
    if not updates:
        raise ValueError("the run logged no update (no rollout/policy_lag row in metrics.csv)")
    n = len(updates)
    steps = sum(u["rollout/valid_steps"] for u in updates)
    tps = [u["perf/effective_tps"] for u in updates if "perf/effective_tps" in u]
    return {
        "updates": n,
        "lag_mean": sum(u["rollout/policy_lag"] for u in updates) / n,
        "lag_step_weighted": sum(u["rollout/policy_lag"] * u["rollout/valid_steps"] for u in updates) / steps,
        "valid_steps": steps,
        "effective_tps_mean": sum(tps) / len(tps) if tps else float("nan"),
        "cut_in_flight_mean": sum(u.get("rollout/cut_in_flight", 0.0) for u in updates) / n,
    }


def run(command: list[str], minutes: float, overrides: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as root:
        seconds = int(round(minutes * 60))
        args = [*command, "fit", *BASE, f"--trainer.default_root_dir={root}",
                f"--trainer.max_time=00:00:{seconds // 60:02d}:{seconds % 60:02d}", *overrides]  # fmt: skip
        proc = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 600)
        if proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return summarise(read_updates(Path(root) / "csv" / "version_0" / "metrics.csv"))


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"Command: `{summary['command']}`",
        "",
        f"Load average {summary['loadavg_start']:.1f} at the start, {summary['loadavg_end']:.1f} at the end.",
        "",
        "| variant | round | updates | policy_lag (mean over updates) | policy_lag (per valid step) "
        "| valid steps | perf/effective_tps (mean) | rounds cut / update |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, v in summary["variants"].items():
        for i, r in enumerate(v["runs"]):
            lines.append(
                f"| {name} | {i + 1} | {r['updates']} | {r['lag_mean']:.3f} | {r['lag_step_weighted']:.3f} "
                f"| {r['valid_steps']:,.0f} | {r['effective_tps_mean']:.1f} | {r['cut_in_flight_mean']:.2f} |"
            )
    lines.append("")
    for name, v in summary["variants"].items():
        lines.append(
            f"- {name}: lag {v['lag_mean']:.3f} (mean of the runs' means), "
            f"{v['valid_steps']:,.0f} valid steps in all, effective_tps {v['effective_tps_mean']:.1f}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--command", default=f"{shlex.quote(sys.executable)} -m fastlight",
                   help="how to launch fastlight (shell words)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=2, help="one run per variant per round")
    p.add_argument("--minutes", type=float, default=4.0, help="--trainer.max_time of each run")
    p.add_argument("--variants", nargs="+", default=["before=--data.rank_rounds=apart", "cut="],
                   help="NAME=OVERRIDES (shell words), compared side by side")  # fmt: skip
    p.add_argument("--out", help="write the results JSON here (and the table next to it, .md)")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.minutes <= 0:
        p.error(f"--rounds must be >= 1 and --minutes > 0, got {a.rounds} and {a.minutes}")
    variants: dict[str, list[str]] = {}
    for text in a.variants:
        name, sep, rest = text.partition("=")
        if not sep or not name:
            p.error(f"--variants entries are NAME=OVERRIDES, got {text!r}")
        variants[name] = shlex.split(rest)
    summary: dict[str, Any] = {
        "command": "python -m benchmarks.sync.lag " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "base": BASE,
        "loadavg_start": os.getloadavg()[0],
        "variants": {n: {"overrides": o, "runs": []} for n, o in variants.items()},
    }
    for i in range(a.rounds):
        order = list(variants) if i % 2 == 0 else list(variants)[::-1]
        for name in order:
            r = run(shlex.split(a.command), a.minutes, variants[name])
            summary["variants"][name]["runs"].append(r)
            load = os.getloadavg()[0]
            print(f"[round {i + 1}] {name}: lag {r['lag_mean']:.3f}, {r['updates']} updates, "
                  f"{r['valid_steps']:,.0f} valid steps, load {load:.1f}", flush=True)  # fmt: skip
    summary["loadavg_end"] = os.getloadavg()[0]
    for v in summary["variants"].values():
        runs = v["runs"]
        v["lag_mean"] = sum(r["lag_mean"] for r in runs) / len(runs)
        v["valid_steps"] = sum(r["valid_steps"] for r in runs)
        v["effective_tps_mean"] = sum(r["effective_tps_mean"] for r in runs) / len(runs)
    text = markdown(summary)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        Path(a.out).write_text(json.dumps(summary, indent=1))
        Path(a.out).with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
