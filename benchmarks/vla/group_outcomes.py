"""Does a VLA's sampling change an episode's outcome? Groups of clips from one initial state, compared.

    python -m benchmarks.vla.group_outcomes --ckpt runs/sft/checkpoints/last.ckpt --task push-v3 \\
        --groups 2 --group-size 4 --cycles 3 --temperature 1.0

Plays ``--cycles`` sampling cycles of ``--groups x --group-size`` Meta-World envs, each group starting
from one seed (``--data.group_size``'s resets), with the checkpoint's policy sampling at
``--temperature``, and prints per group: the clips' successes and lengths and the spread (std, cm) of
the hand's final position. RL (GAE or GRPO) can only learn from the differences within a group: when
every group ends alike, the sampled actions carry no signal about the outcome.
"""

from __future__ import annotations

import argparse
import json

import torch

COMMAND = "python -m benchmarks.vla.group_outcomes"


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(
        prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ckpt", required=True)
    p.add_argument("--task", default="push-v3")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--temperature", type=float, default=1.0, help="a token VLA's sampling temperature")
    p.add_argument(
        "--noise-level", type=float, default=None, help="a flow VLA's SDE noise (default: its own)"
    )
    p.add_argument(
        "--sde-steps", choices=("one", "all"), default=None, help="a flow VLA's (default: its own)"
    )
    p.add_argument("--max-path-length", type=int, default=150)
    p.add_argument("--seed", type=int, default=5)
    args = p.parse_args(argv)
    if (
        min(args.groups, args.group_size, args.cycles) < 1
        or min(args.temperature, args.noise_level or 1) <= 0
    ):
        p.error("--groups, --group-size and --cycles must be >= 1, --temperature and --noise-level > 0")

    from fastlight.envs.metaworld import MetaWorldEnv
    from fastlight.modules.loading import load_module
    from fastlight.sampling.collector import Collector
    from fastlight.vla.flow_policy import FlowVLAPolicy
    from fastlight.vla.policy import VLAPolicy

    policy = load_module(args.ckpt).policy.eval()
    if isinstance(policy, FlowVLAPolicy):
        policy.noise_level = policy.noise_level if args.noise_level is None else args.noise_level
        policy.sde_steps = args.sde_steps or policy.sde_steps
    elif isinstance(policy, VLAPolicy):
        policy.temperature = args.temperature
    else:
        p.error(f"--ckpt {args.ckpt}: not a VLA checkpoint ({type(policy).__name__})")
    n = args.groups * args.group_size
    envs = [MetaWorldEnv(args.task, image=False, max_path_length=args.max_path_length) for _ in range(n)]
    collector = Collector(envs, mode="dpsa", termination_threshold=1.0, max_horizon=args.max_path_length,
                          seed=args.seed, group_size=args.group_size)  # fmt: skip
    out = []
    for cycle in range(args.cycles):
        r = collector.collect(policy)
        last = r.valid.sum(0) - 1  # each clip's last valid step
        hand = r.obs["proprio"][last, torch.arange(n), :3]  # [E, 3] m
        for g in range(args.groups):
            cols = slice(g * args.group_size, (g + 1) * args.group_size)
            row = {
                "cycle": cycle,
                "group": g,
                "success": r.terminated[:, cols].any(0).tolist(),
                "length": r.valid[:, cols].sum(0).tolist(),
                "hand_spread_cm": [round(100 * float(v), 2) for v in hand[cols].std(0)],
            }
            out.append(row)
            print(json.dumps(row), flush=True)
    collector.close()
    mixed = sum(len(set(row["success"])) > 1 for row in out)
    print(f"{COMMAND}: {mixed} of {len(out)} groups had both successes and failures", flush=True)
    return out


if __name__ == "__main__":
    main()
