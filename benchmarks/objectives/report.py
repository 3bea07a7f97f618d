"""``objectives.md`` / ``objectives.json`` / ``objectives_profile_lag<k>.png`` from a finished grid."""

from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np

from benchmarks.objectives.grid import GridConfig
from benchmarks.objectives.run import RANDOM_EPISODES, random_score
from benchmarks.objectives.stats import (
    aggregate,
    improvement,
    normalise,
    performance_profile_png,
    score_matrix,
)

#: AcceRL §GIPO / Table 9 as the paper's text gives them (10 MuJoCo tasks, 196 runs, last 50
#: evaluation points). The text names the best GIPO "GIPO(0.2, 1.0)"; values it does not give are None.
ACCERL_TABLE9 = {
    "gipo0.2": {"iqm": 0.724, "mean": 0.651},
    "ppo": {"iqm": 0.595, "mean": None},
    "sapo": {"iqm": 0.315, "mean": None},
}


def summarise(grid: GridConfig, results: list[dict], cache_dir: str, *, reps: int = 2000) -> dict:
    """Everything the report shows, as plain data (the JSON file)."""
    cache = os.path.join(cache_dir, "random_scores.json")
    random = {env: random_score(env, cache) for env in grid.envs}
    raw = {(r["variant"], r["env"], r["lag"], r["seed"]): r for r in results}
    # A run with no completed episode in its last points has no score: counted as the random policy.
    score = {k: (r["score"] if r["score"] is not None else random[k[1]]) for k, r in raw.items()}
    reference = {env: max(s for k, s in score.items() if k[1] == env) for env in grid.envs}
    # Normalising needs reference > random: on an env where no run beat the random policy the
    # scale is undefined (a negative span would turn the ordering upside down), so it is left out.
    scored = tuple(env for env in grid.envs if reference[env] > random[env])
    out: dict = {
        "grid": grid.to_json(),
        "random_score": random,
        "reference_score": reference,
        "normalisation": "(score - random) / (best score of any run on the env - random)",
        "envs_scored": list(scored),
        "envs_left_out": [env for env in grid.envs if env not in scored],
        "by_lag": {},
        "runs": [{k: v for k, v in r.items() if k != "curve"} for r in results],
    }
    for lag in grid.lags if scored else ():
        norm = {
            (v, env, seed): normalise(score[(v, env, lag, seed)], random[env], reference[env])
            for v in grid.variants
            for env in scored
            for seed in grid.seeds
        }
        matrix = score_matrix(norm, variants=grid.variants, envs=scored, seeds=grid.seeds)
        block = {"aggregate": aggregate(matrix, reps=reps), "matrix": {}}
        if "gipo0.2" in matrix and "ppo" in matrix:
            block["p_improvement_gipo0.2_over_ppo"] = improvement(matrix, "gipo0.2", "ppo", reps=reps)
        for other in ("gipo0.2", "ppo"):  # SAPO's place in AcceRL's ordering: below both
            if other in matrix and "sapo" in matrix:
                block[f"p_improvement_{other}_over_sapo"] = improvement(matrix, other, "sapo", reps=reps)
        block["matrix"] = {v: m.tolist() for v, m in matrix.items()}
        out["by_lag"][str(lag)] = block
    out["measured_lag"] = {str(lag): _lags(raw, lag) for lag in grid.lags}
    out["throughput"] = _throughput(results, grid.envs)
    return out


def _lags(raw: dict, lag: int) -> dict[str, float]:
    runs = [r for k, r in raw.items() if k[2] == lag]
    return {
        "mean_lag": float(np.mean([r["mean_lag"] for r in runs])),
        "max_lag": int(max(r["max_lag"] for r in runs)),
        "dropped_stale_items": int(sum(r["dropped_stale"] for r in runs)),
    }


def _throughput(results: list[dict], envs: tuple[str, ...]) -> dict[str, dict[str, float]]:
    by_env: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        by_env[r["env"]].append(r)
    out = {}
    for env in envs:
        runs = by_env[env]
        sampler = float(np.mean([r["sampler_tps"] for r in runs]))
        e2e = float(np.mean([r["end_to_end_tps"] for r in runs]))
        plain = float(np.mean([r["plain_loop_tps"] for r in runs]))
        ratios = [r["sampler_tps"] / r["plain_loop_tps"] for r in runs]
        out[env] = {
            "sampler_tps": sampler,
            "end_to_end_tps": e2e,
            "plain_loop_tps": plain,
            "sampler_ratio": float(np.mean(ratios)),
            "sampler_ratio_min": float(np.min(ratios)),
            "end_to_end_ratio": float(np.mean([r["end_to_end_tps"] / r["plain_loop_tps"] for r in runs])),
        }
    return out


def write_report(
    grid: GridConfig,
    results: list[dict],
    *,
    results_dir: str,
    cache_dir: str,
    command: str,
    interleaved: dict[str, dict[str, float]] | None = None,
) -> dict:
    summary = summarise(grid, results, cache_dir)
    summary["throughput_interleaved"] = interleaved or {}
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, "objectives.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for lag, block in summary["by_lag"].items():
        matrix = {v: np.asarray(m) for v, m in block["matrix"].items()}
        png = os.path.join(results_dir, f"objectives_profile_lag{lag}.png")
        performance_profile_png(matrix, png, title=f"MuJoCo, max_staleness {lag}: performance profile")
    with open(os.path.join(results_dir, "objectives.md"), "w") as f:
        f.write(markdown(grid, summary, command))
    return summary


def _ci(x: list[float]) -> str:
    return f"[{x[0]:.3f}, {x[1]:.3f}]"


def _paper(variant: str, key: str) -> str:
    value = ACCERL_TABLE9.get(variant, {}).get(key)
    return "-" if value is None else f"{value:.3f}"


def _verdict(block: dict, lag: int) -> list[str]:
    agg = block["aggregate"]
    lines = []
    if "gipo0.2" in agg and "ppo" in agg:
        g, p = agg["gipo0.2"]["iqm"], agg["ppo"]["iqm"]
        poi = block["p_improvement_gipo0.2_over_ppo"]
        holds = "holds" if g >= p else "does not hold"
        lines.append(
            f"At max_staleness {lag}, AcceRL's ordering GIPO(0.2) >= PPO on IQM **{holds}** here "
            f"({g:.3f} vs {p:.3f}); P(GIPO(0.2) > PPO) = {poi['p']:.2f} {_ci(poi['ci'])}"
            + (
                " - the CI reaches 0.5, so the difference is not resolved."
                if poi["ci"][0] <= 0.5 <= poi["ci"][1]
                else "."
            )
        )
    if "sapo" in agg:
        others = [v for v in ("gipo0.2", "ppo") if v in agg]
        below = all(agg["sapo"]["iqm"] < agg[v]["iqm"] for v in others)
        line = (
            f"SAPO's IQM ({agg['sapo']['iqm']:.3f}) is {'below' if below else 'not below'} "
            + " and ".join(f"{v} ({agg[v]['iqm']:.3f})" for v in others)
            + (", as in AcceRL" if below else ", unlike AcceRL")
        )
        pois = {
            v: block[f"p_improvement_{v}_over_sapo"]
            for v in others
            if f"p_improvement_{v}_over_sapo" in block
        }
        if pois:
            unresolved = [v for v, poi in pois.items() if poi["ci"][0] <= 0.5 <= poi["ci"][1]]
            line += "; " + ", ".join(
                f"P({v} > SAPO) = {poi['p']:.2f} {_ci(poi['ci'])}" for v, poi in pois.items()
            )
            line += (
                f" - the CI reaches 0.5 for {' and '.join(unresolved)}: not resolved at this seed count."
                if unresolved
                else "."
            )
        else:
            line += "."
        lines.append(line)
    return lines


def _env_table(grid: GridConfig, summary: dict, lag: int) -> list[str]:
    """Raw scores (mean over seeds) per env and variant, with the random and reference scores."""
    runs = [r for r in summary["runs"] if r["lag"] == lag]
    rows = ["| env | random | reference | " + " | ".join(grid.variants) + " |"]
    rows.append("|---" * (3 + len(grid.variants)) + "|")
    for env in grid.envs:
        cells = []
        for v in grid.variants:
            s = [r["score"] for r in runs if r["env"] == env and r["variant"] == v and r["score"] is not None]
            cells.append(f"{np.mean(s):.1f}" if s else "-")
        rows.append(
            f"| {env} | {summary['random_score'][env]:.1f} | {summary['reference_score'][env]:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    return rows


def _aggregate_table(grid: GridConfig, block: dict, lag: int) -> list[str]:
    lines = [
        "| variant | IQM | 95% CI | mean | 95% CI | AcceRL IQM | AcceRL mean |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in grid.variants:
        a = block["aggregate"][v]
        lines.append(
            f"| {v} | {a['iqm']:.3f} | {_ci(a['iqm_ci'])} | {a['mean']:.3f} | {_ci(a['mean_ci'])} | "
            f"{_paper(v, 'iqm')} | {_paper(v, 'mean')} |"
        )
    return [*lines, "", *_verdict(block, lag), "", f"![profile](objectives_profile_lag{lag}.png)", ""]


def markdown(grid: GridConfig, summary: dict, command: str) -> str:
    lines = [
        "# GIPO vs PPO vs SAPO under policy lag (MuJoCo, rliable)",
        "",
        "Command:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Grid `{grid.fingerprint()}`: {len(grid.envs)} envs ({', '.join(grid.envs)}) x "
        f"{len(grid.variants)} variants x seeds {list(grid.seeds)} x max_staleness {list(grid.lags)}; "
        f"{grid.budget} env steps per run = {grid.updates} updates of {grid.num_envs} envs x "
        f"{grid.rollout_steps} steps (RolloutDataModule has no env-step budget, so the run length is "
        f"the update count derived from the rollout size), {grid.update_epochs} epochs x "
        f"{grid.num_minibatches} minibatches, Adam lr {grid.lr}, no entropy bonus, one sampler process "
        "(autoreset) per run.",
        "",
        f"**Score** of a run: the mean over its last {grid.last_k} curve points, a point being the mean "
        "return of the episodes that completed in one training batch (training returns of the "
        f"stochastic policy; AcceRL uses its last 50 evaluation points). **Normalised** per env: "
        f"0 = a uniform-random policy ({RANDOM_EPISODES} seeded episodes, cached), 1 = the reference, "
        "the best score of any run of this grid on that env (any variant, seed and lag). IQM and mean "
        "over the runs x envs matrix with stratified-bootstrap 95% CIs (rliable, 2000 reps).",
        "",
        "**Lag**: max_staleness k lets the sampler act with weights up to k updates old; the measured "
        "lag is the trainer's version minus the version stamped on each valid step, averaged over the "
        "steps each update trained on (per run in the JSON). With k >= 1 the sampler never waits, so "
        "it outruns the learner and rounds older than k versions are dropped before training "
        f"('stale items dropped', each {grid.num_envs} envs x {grid.rollout_steps} steps); the budget "
        "counts trained-on steps only.",
        "",
    ]
    if summary["envs_left_out"]:
        lines += [
            f"Left out of the aggregates: {', '.join(summary['envs_left_out'])}: no run of any variant "
            "scored above the random policy within the budget, so the normalisation has no scale there "
            "(raw scores below).",
            "",
        ]
    for lag in grid.lags:
        measured = summary["measured_lag"][str(lag)]
        lines += [
            f"## max_staleness {lag} (measured mean lag {measured['mean_lag']:.2f}, "
            f"max {measured['max_lag']}, stale items dropped {measured['dropped_stale_items']})",
            "",
        ]
        if str(lag) in summary["by_lag"]:
            lines += _aggregate_table(grid, summary["by_lag"][str(lag)], lag)
        lines += ["Raw scores (mean over seeds):", "", *_env_table(grid, summary, lag), ""]
    lines += [
        "AcceRL's numbers: 10 MuJoCo tasks, 196 runs, last 50 evaluation points; the text gives GIPO's "
        "best (named 'GIPO(0.2, 1.0)') IQM 0.724 and mean 0.651, PPO IQM 0.595, SAPO IQM 0.315, and no "
        "other cell. Its budget per run and reference scores are not stated, so only the orderings "
        "compare, not the values.",
        "",
        "## Throughput",
        "",
    ]
    if summary.get("throughput_interleaved"):
        from benchmarks.objectives.throughput import markdown as interleaved_table

        lines += [interleaved_table(summary["throughput_interleaved"]), ""]
    lines += [
        "During the runs (each run's sampler while its learner trains, so the two share the cores, and "
        "the plain loop timed once after the run):",
        "",
        "Sampler: valid env steps per second of the sampler's busy time (policy inference included); "
        "end to end: env steps the learner consumed per second of training (updates included); plain: a "
        "bare gymnasium loop with random actions on the same env, measured in the same process right "
        "after the run (the physical ceiling). Target: sampler >= 70% of plain.",
        "",
        "| env | plain loop steps/s | sampler steps/s | ratio (min over runs) | end-to-end steps/s | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for env, t in summary["throughput"].items():
        lines.append(
            f"| {env} | {t['plain_loop_tps']:.0f} | {t['sampler_tps']:.0f} | {t['sampler_ratio']:.0%} "
            f"({t['sampler_ratio_min']:.0%}) | {t['end_to_end_tps']:.0f} | {t['end_to_end_ratio']:.0%} |"
        )
    return "\n".join(lines) + "\n"
