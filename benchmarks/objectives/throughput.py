"""The objectives study's sampler throughput against a plain gymnasium loop, measured interleaved.

    python -m benchmarks.objectives.throughput --envs InvertedPendulum-v5 Hopper-v5 --rounds 30

Per env, one process alternates two blocks ``rounds`` times: a plain gymnasium loop (one env,
random actions, ``plain_steps`` steps: the physical ceiling) and one ``collect()`` of fastlight's
:class:`~fastlight.sampling.collector.Collector` exactly as a study run's sampler makes it (the
grid's ``num_envs`` autoreset envs, ``rollout_steps`` steps, the run's MLP policy acting, NaN
checks, log-probs and values, the Rollout assembled). Both see the same machine state, which is
why this is the target's measurement: a loop timed once after a run varies 2x between runs on a
shared machine. Reported: steps/s of each, the ratio of their total times, and the median and
range of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import gymnasium as gym
import numpy as np
import torch

from benchmarks.objectives.grid import QUICK_ENVS, GridConfig, check_grid
from benchmarks.objectives.run import plain_steps_s
from fastlight.envs.registry import make_env
from fastlight.modules.rl_module import RLModule
from fastlight.sampling.collector import Collector

#: The issue's target: the sampler path reaches this fraction of the plain loop.
TARGET_RATIO = 0.7


def measure_env(
    env_id: str, *, num_envs: int, rollout_steps: int, rounds: int, plain_steps: int, seed: int = 0
) -> dict[str, float]:
    """Interleaved plain-loop and Collector blocks on ``env_id``; returns steps/s and ratios."""
    torch.manual_seed(seed)
    envs = [make_env(env_id) for _ in range(num_envs)]
    obs_dim = int(np.prod(envs[0].observation_space.shape))
    module = RLModule(obs_dim=obs_dim, action_dim=int(np.prod(envs[0].action_space.shape)), continuous=True)
    module.configure_model()
    policy = module.policy
    collector = Collector(envs, mode="autoreset", rollout_steps=rollout_steps, seed=seed)
    plain = gym.make(env_id)
    plain.reset(seed=seed)
    plain.action_space.seed(seed)

    with torch.no_grad():
        collector.collect(policy)  # first resets and lazy torch init out of the timing
        plain_steps_s(plain, plain_steps)
        plain_s = collector_s = 0.0
        collected = 0
        ratios = []
        for _ in range(rounds):
            p = plain_steps_s(plain, plain_steps)
            t0 = time.perf_counter()
            rollout = collector.collect(policy)
            c = time.perf_counter() - t0
            n = int(rollout.valid.sum())
            plain_s += p
            collector_s += c
            collected += n
            ratios.append((n / c) / (plain_steps / p))
    collector.close()
    plain.close()
    plain_tps = rounds * plain_steps / plain_s
    sampler_tps = collected / collector_s
    return {
        "plain_loop_tps": plain_tps,
        "sampler_tps": sampler_tps,
        "ratio": sampler_tps / plain_tps,
        "ratio_median": float(np.median(ratios)),
        "ratio_min": float(np.min(ratios)),
        "ratio_max": float(np.max(ratios)),
        "rounds": rounds,
        "num_envs": num_envs,
        "rollout_steps": rollout_steps,
    }


def markdown(results: dict[str, dict[str, float]], *, command: str | None = None) -> str:
    lines = [
        "Interleaved on one process (`benchmarks.objectives.throughput`): a plain gymnasium loop "
        "(one env, random actions) and one `Collector.collect()` as a run's sampler makes it, "
        "alternated; ratio = sampler steps/s over plain steps/s from the summed times, with the "
        f"per-round median and range. Target: >= {TARGET_RATIO:.0%}.",
        "",
        *([f"Command: `{command}`", ""] if command else []),
        "| env | plain loop steps/s | sampler steps/s | ratio | per-round median (min-max) | target |",
        "|---|---|---|---|---|---|",
    ]
    for env, r in results.items():
        met = "met" if r["ratio"] >= TARGET_RATIO else f"missed by {TARGET_RATIO - r['ratio']:.0%}"
        lines.append(
            f"| {env} | {r['plain_loop_tps']:.0f} | {r['sampler_tps']:.0f} | {r['ratio']:.0%} | "
            f"{r['ratio_median']:.0%} ({r['ratio_min']:.0%}-{r['ratio_max']:.0%}) | {met} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    grid = GridConfig(envs=QUICK_ENVS, variants=("ppo",), lags=(0,), seeds=(0,), budget=1)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=list(QUICK_ENVS), help="MuJoCo v5 ids (default: --quick's)")
    p.add_argument("--rounds", type=int, default=30, help="interleaved block pairs per env")
    p.add_argument("--plain-steps", type=int, default=1024, help="plain-loop steps per block")
    p.add_argument("--num-envs", type=int, default=grid.num_envs, help="envs per Collector (a run's)")
    p.add_argument("--rollout-steps", type=int, default=grid.rollout_steps, help="steps per collect()")
    p.add_argument("--out", help="write the results JSON here")
    args = p.parse_args(argv)
    for flag, value in (("--rounds", args.rounds), ("--plain-steps", args.plain_steps)):
        if value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    try:
        check_grid(envs=args.envs, variants=["ppo"], lags=[0], seeds=[0], budget=1)
    except ValueError as e:
        p.error(str(e))
    command = "python -m benchmarks.objectives.throughput " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    results = {}
    for env in args.envs:
        results[env] = measure_env(
            env,
            num_envs=args.num_envs,
            rollout_steps=args.rollout_steps,
            rounds=args.rounds,
            plain_steps=args.plain_steps,
        )
        print(markdown({env: results[env]}, command=command).splitlines()[-1], flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"command": command, "load_avg": os.getloadavg(), "envs": results}, f, indent=1)
    print(markdown(results, command=command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
