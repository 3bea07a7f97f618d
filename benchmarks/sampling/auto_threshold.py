"""``python -m benchmarks.sampling.auto_threshold``: ``termination_threshold: auto`` against a sweep
of fixed DPSA thresholds (FAST §DPSA), on one sampler's Collector with a fixed random policy.

Two envs:

- ``uneven``: every episode lasts 3 or 200 steps (even odds), and every reset sleeps
  ``--reset-cost`` seconds (0.2: an emulated scenario load, :class:`ScenarioLoadCost`); the case
  where a threshold of 0.5 cuts every long episode at step 3;
- ``highway-fast-v0`` with its own resets (a random policy crashes in a few to 30 steps).

Each setting (the fixed thresholds ``k / E`` for ``k = 1..E``, and ``auto``) keeps one Collector for
the whole run, so ``auto`` learns as it would in training. The settings run interleaved, in
``--rounds`` rounds of ``--seconds`` each, so slow drifts of machine load spread over all of them;
their counters are summed. For each: effective throughput (valid transitions per second, FAST's
metric), the share of episodes cut by the threshold (not by the horizon), and, for ``auto``, the
thresholds it used. The target: ``auto`` within 10 % of the best fixed threshold whose cut share
is at most auto's cap (:data:`~fastlight.sampling.auto_threshold.MAX_CUT_SHARE`); the best fixed
threshold of any cut share is shown too.

Writes ``auto_threshold.md`` and ``auto_threshold.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from benchmarks.sampling.runs import RandomPolicy
from fastlight.envs.registry import make_env
from fastlight.envs.scenario_cost import ScenarioLoadCost
from fastlight.sampling.auto_threshold import MAX_CUT_SHARE
from fastlight.sampling.collector import Collector

TARGET = 0.9  # auto's effective throughput >= 90 % of the best allowed fixed threshold's


class UnevenEnv(gym.Env):
    """Episodes of ``short`` or ``long`` steps (chance ``p_long``), from the env's own RNG."""

    def __init__(self, short: int = 3, long: int = 200, p_long: float = 0.5) -> None:
        self.short, self.long, self.p_long = short, long, p_long
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = self.length = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t / self.long, self.length / self.long, 0.0, 1.0], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.length = self.long if self.np_random.random() < self.p_long else self.short
        return self._obs(), {}

    def step(self, action: Any):
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}


@dataclass
class Cell:
    """One setting's Collector and its summed counters."""

    name: str
    collector: Collector
    valid: int = 0
    wall: float = 0.0
    episodes: int = 0
    cut_by_threshold: int = 0
    thresholds: list[float] = field(default_factory=list)

    def run_for(self, seconds: float, policy: RandomPolicy, max_horizon: int) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            stats = self.collector.collect(policy).stats
            self.valid += stats.valid_steps
            self.wall += stats.wall_time
            self.episodes += len(stats.episodes)
            self.cut_by_threshold += sum(e.cut and e.length < max_horizon for e in stats.episodes)
            self.thresholds.append(stats.threshold_sum / stats.global_resets)

    def row(self) -> dict[str, Any]:
        return {
            "setting": self.name,
            "effective_tps": self.valid / self.wall if self.wall else float("nan"),
            "cut_share": self.cut_by_threshold / self.episodes if self.episodes else float("nan"),
            "cycles": len(self.thresholds),
            "mean_threshold": float(np.mean(self.thresholds)) if self.thresholds else float("nan"),
            "valid_steps": self.valid,
        }


def build_envs(env: str, num_envs: int, reset_cost: float) -> list[gym.Env]:
    if env == "uneven":
        return [ScenarioLoadCost(seconds=reset_cost).wrap(UnevenEnv()) for _ in range(num_envs)]
    return [make_env(env, env_kwargs={"disable_env_checker": True}, flag="--env") for _ in range(num_envs)]


def run_env(env: str, args: argparse.Namespace) -> dict[str, Any]:
    e = args.envs
    settings: list[float | str] = [k / e for k in range(1, e + 1)] + ["auto"]
    cells = []
    for i, thr in enumerate(settings):
        collector = Collector(
            build_envs(env, e, args.reset_cost), mode="dpsa", termination_threshold=thr,
            max_horizon=args.max_horizon, seed=1000 * i,
        )  # fmt: skip
        cells.append(Cell(str(thr) if thr == "auto" else f"{thr:.3f}", collector))
    policy = RandomPolicy(2 if env == "uneven" else 5, seed=0)
    for r in range(args.rounds):
        order = cells if r % 2 == 0 else cells[::-1]  # interleaved, alternating order
        for cell in order:
            cell.run_for(args.seconds, policy, args.max_horizon)
        print(f"[{env}] round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rows = [c.row() for c in cells]
    for c in cells:
        c.collector.close()
    fixed = [row for row in rows if row["setting"] != "auto"]
    allowed = [row for row in fixed if row["cut_share"] <= MAX_CUT_SHARE]
    best_allowed = max(allowed, key=lambda row: row["effective_tps"])
    best_any = max(fixed, key=lambda row: row["effective_tps"])
    auto = next(row for row in rows if row["setting"] == "auto")
    ratio = auto["effective_tps"] / best_allowed["effective_tps"]
    return {
        "env": env,
        "rows": rows,
        "best_allowed": best_allowed["setting"],
        "best_any": best_any["setting"],
        "auto_vs_best_allowed": ratio,
        "auto_vs_best_any": auto["effective_tps"] / best_any["effective_tps"],
        "met": ratio >= TARGET,
    }


def write(results: list[dict[str, Any]], args: argparse.Namespace, out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "auto_threshold.json").write_text(json.dumps({"command": command, "results": results}, indent=1))
    lines = [
        "# `termination_threshold: auto` against fixed DPSA thresholds",
        "",
        f"Command: `{command}`",
        "",
        f"One sampler's Collector, {args.envs} envs, a fixed random policy, max_horizon {args.max_horizon}; "
        f"the settings interleaved in {args.rounds} rounds of {args.seconds:g} s each (counters summed). "
        "Effective throughput = valid transitions / sampler wall time (FAST). Cut share = episodes cut by "
        f"the threshold (not the horizon) / episodes. auto's cap on the cut share: {MAX_CUT_SHARE}.",
        "",
    ]
    for res in results:
        lines += [
            f"## {res['env']}",
            "",
            "| setting | effective tps | cut share | mean threshold used | cycles | valid steps |",
            "|---|---|---|---|---|---|",
        ]
        for row in res["rows"]:
            mark = " (best allowed)" if row["setting"] == res["best_allowed"] else ""
            mark += " (best of any cut share)" if row["setting"] == res["best_any"] else ""
            lines.append(
                f"| {row['setting']}{mark} | {row['effective_tps']:.0f} | {row['cut_share']:.3f} | "
                f"{row['mean_threshold']:.3f} | {row['cycles']} | {row['valid_steps']} |"
            )
        verdict = "met" if res["met"] else "MISSED"
        lines += [
            "",
            f"auto / best allowed fixed ({res['best_allowed']}): **{res['auto_vs_best_allowed']:.3f}** "
            f"(target >= {TARGET}: {verdict}); auto / best fixed of any cut share ({res['best_any']}): "
            f"{res['auto_vs_best_any']:.3f}.",
            "",
        ]
    (out / "auto_threshold.md").write_text("\n".join(lines))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.sampling.auto_threshold", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--env", nargs="+", default=["uneven", "highway-fast-v0"], help="uneven and/or gymnasium ids"
    )
    p.add_argument("--envs", type=int, default=8, help="envs of the one sampler (E)")
    p.add_argument("--max-horizon", type=int, default=250, help="DPSA cycle cap")
    p.add_argument(
        "--reset-cost", type=float, default=0.2, help="emulated seconds per reset of the uneven env"
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--seconds", type=float, default=8.0, help="seconds per setting per round")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder for the .md / .json")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    command = "python -m benchmarks.sampling.auto_threshold " + shlex.join(
        sys.argv[1:] if argv is None else list(argv)
    )
    results = [run_env(env, args) for env in args.env]
    write(results, args, args.out, command.strip())
    for res in results:
        print(
            f"{res['env']}: auto / best allowed fixed ({res['best_allowed']}) = "
            f"{res['auto_vs_best_allowed']:.3f}"
        )


if __name__ == "__main__":
    main()
