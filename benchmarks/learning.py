"""Learning check: evaluation returns of a trained checkpoint against a uniform-random policy.

    python -m benchmarks.learning --ckpt runs/highway_dpsa/checkpoints/last.ckpt
    python -m benchmarks.learning --ckpt runs/highway_dpsa/checkpoints/last.ckpt --out benchmarks/results

Both policies play the same ``--episodes`` seeds of the env to their natural end. Reports mean
return with a 95% bootstrap confidence interval and Welch's t-test, and writes
``main_job.md`` / ``main_job.json`` to ``--out``: by default a folder beside the checkpoint
(``<ckpt without .ckpt>_learning/``), so a check of some run never overwrites the published
``benchmarks/results/main_job.md``; ``--out benchmarks/results`` updates that one on purpose.
The checkpoint may hold any fastlight module class (``RLModule`` or a subclass, e.g.
``examples.merge_module.MergeModule``): the class recorded in it is rebuilt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

import numpy as np

from fastlight.checkpoints import read_checkpoint
from fastlight.evaluation import policy_act_fn, run_episodes
from fastlight.extras import check_extra
from fastlight.modules.loading import load_module

check_extra("scipy", extra="bench", what="python -m benchmarks.learning")
from scipy import stats  # noqa: E402


def summarise(returns: list[float]) -> dict[str, float]:
    arr = np.asarray(returns, dtype=np.float64)
    ci = stats.bootstrap((arr,), np.mean, confidence_level=0.95, random_state=0).confidence_interval
    return {
        "mean": float(arr.mean()),
        "std": float(arr.std(ddof=1)),
        "ci_low": float(ci.low),
        "ci_high": float(ci.high),
        "n": int(arr.size),
    }


def compare(
    ckpt: str,
    *,
    env_id: str,
    episodes: int,
    seed: int,
    deterministic: bool,
    env_kwargs: dict | None = None,
) -> dict:
    module = load_module(ckpt)  # whatever module class the checkpoint records
    act = policy_act_fn(module.policy, deterministic=deterministic)
    trained = run_episodes(env_id, act, episodes=episodes, seed=seed, env_kwargs=env_kwargs)
    rand = run_episodes(env_id, None, episodes=episodes, seed=seed, env_kwargs=env_kwargs)
    t = stats.ttest_ind([e.ret for e in trained], [e.ret for e in rand], equal_var=False)
    return {
        "ckpt": ckpt,
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "episodes": episodes,
        "seed": seed,
        "deterministic": deterministic,
        "policy_version": module.policy_version,
        "trained": {
            **summarise([e.ret for e in trained]),
            "mean_length": float(np.mean([e.length for e in trained])),
            "crash_rate": float(np.mean([e.crashed is True for e in trained])),  # None: not reported
        },
        "random": {
            **summarise([e.ret for e in rand]),
            "mean_length": float(np.mean([e.length for e in rand])),
            "crash_rate": float(np.mean([e.crashed is True for e in rand])),  # None: not reported
        },
        "welch_t": float(t.statistic),
        "p_value": float(t.pvalue),
        "episodes_trained": [asdict(e) for e in trained],
    }


def write_markdown(result: dict, path: str, command: str) -> None:
    rows = []
    for name in ("random", "trained"):
        r = result[name]
        rows.append(
            f"| {name} | {r['mean']:.2f} | [{r['ci_low']:.2f}, {r['ci_high']:.2f}] | {r['std']:.2f} | "
            f"{r['mean_length']:.1f} | {r['crash_rate']:.0%} |"
        )
    ratio = result["trained"]["mean"] / max(result["random"]["mean"], 1e-9)
    text = "\n".join(
        [
            f"# Main job: learning check (PPO + SMPO, DPSA rollouts, {result['env_id']})",
            "",
            f"Evaluation over {result['episodes']} episodes (seeds {result['seed']} onwards),"
            f" each played to its natural end; policy after {result['policy_version']} updates"
            f" ({'greedy' if result['deterministic'] else 'sampled'} actions).",
            "",
            "| policy | mean return | 95% bootstrap CI | std | mean episode length | crash rate |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"Trained / random mean return: **{ratio:.2f}x**; Welch's t = {result['welch_t']:.2f}, "
            f"p = {result['p_value']:.2g}.",
            "",
            "Command:",
            "",
            "```bash",
            command,
            "```",
            "",
        ]
    )
    with open(path, "w") as f:
        f.write(text)


def default_out(ckpt: str) -> str:
    """``runs/x/checkpoints/last.ckpt`` -> ``runs/x/checkpoints/last_learning``: one folder per checkpoint."""
    base, ext = os.path.splitext(ckpt)
    return (base if ext == ".ckpt" else ckpt) + "_learning"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--env", help="gymnasium id (default: the checkpoint's data.env_id, else highway-fast-v0)")
    p.add_argument("--episodes", type=int, default=30)
    p.add_argument("--seed", type=int, default=10_000)
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--out", help="folder for main_job.md / .json (default: <ckpt without .ckpt>_learning)")
    p.add_argument("--train-command", default="make train", help="recorded in the results file")
    args = p.parse_args(argv)
    if args.episodes < 2:  # a t-test and a standard deviation need two episodes
        p.error(f"--episodes must be >= 2, got {args.episodes}")
    args.out = args.out or default_out(args.ckpt)
    # Class paths of the project being run (examples.*, a user's package), as `fastlight fit` does.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        data = read_checkpoint(args.ckpt, flag="--ckpt").get("datamodule_hyper_parameters") or {}
        # The checkpoint's env settings, unless --env names another env (whose kwargs may differ).
        env_kwargs = data.get("env_kwargs") if args.env in (None, data.get("env_id")) else None
        args.env = args.env or data.get("env_id") or "highway-fast-v0"
        result = compare(
            args.ckpt,
            env_id=args.env,
            env_kwargs=env_kwargs,
            episodes=args.episodes,
            seed=args.seed,
            deterministic=args.deterministic,
        )
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e).splitlines()[0])
    os.makedirs(args.out, exist_ok=True)
    shown = (
        f"--ckpt {args.ckpt} --out {args.out} --env {args.env} --episodes {args.episodes} --seed {args.seed}"
    )
    shown += " --deterministic" if args.deterministic else ""
    command = f"{args.train_command}\npython -m benchmarks.learning {shown}"
    write_markdown(result, os.path.join(args.out, "main_job.md"), command)
    with open(os.path.join(args.out, "main_job.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("trained", "random", "p_value")}, indent=1))
    return result


if __name__ == "__main__":
    main()
