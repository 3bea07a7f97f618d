"""What the flow-matching VLA (``FlowVLAPolicy``, pi0 through flow-SDE) costs per env step on the CPU.

    python -m benchmarks.vla.flow_cost --reps 40 --env-steps 1600 --rounds 2 --out benchmarks/results/vla_flow

Four settings, ``num_steps`` (K, Euler steps of the denoising chain) in {10, 4} x ``action_chunk`` (H, env
steps executed per call) in {8, 1}, one :class:`~fastlight.vla.flow_policy.FlowVLAPolicy` each over the
same tiny random pi0 folder (:func:`benchmarks.tiny_vlm.save_tiny_pi0`, ``chunk_size`` 8, ``action_dim``
4, ``state_dim`` 39, hidden 32, 2 layers), state + instruction as ``configs/vla_metaworld_flow.yaml``:

- **policy cost**: one ``act`` call on a batch of N observations of the config's env (reset observations
  of N envs), timed ``--reps`` times after warm-up, the settings interleaved call by call (a shared
  2-core machine drifts between runs); medians. Forward hooks on the VLM (``backbone.model.vlm``: the
  prefix) and on the action expert (``backbone.model.dit``) count the batched forwards each call makes,
  checked against 1 prefix + K expert passes; per env step they are divided by H (one batched forward
  answers all N envs);
- **end to end**: N envs of the config's env (``data.env_id`` / ``data.env_kwargs`` read from the
  config), the policy acting under ``inference_mode``, each env executing its chunk step by step (an
  episode that ends inside a chunk is reset and skips the rest of it, as the collector does), for
  ``--env-steps`` env steps (all envs together) per setting per round, the settings alternating round by
  round. Wall time splits into the policy (``act`` + ``env_action``), ``env.step``, resets, and the rest
  (stacking observations, the loop).

One process, one torch thread (a sampler's setting), the policy on the CPU. The model is tiny and random:
the numbers are the framework's and the simulator's costs at this size, and how K and H scale them, not a
pretrained pi0's compute.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

COMMAND = "python -m benchmarks.vla.flow_cost"
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "vla_metaworld_flow.yaml"
CHUNK_SIZE, ACTION_DIM, STATE_DIM = 8, 4, 39


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def env_settings(config: Path = CONFIG) -> tuple[str, dict[str, Any], int]:
    """``(env_id, env_kwargs, max_episode_steps)`` of the flow config, as its data module builds the env."""
    cfg = yaml.safe_load(config.read_text())
    data = cfg["data"]["init_args"]
    policy = cfg["model"]["init_args"]["policy"]["init_args"]
    return data["env_id"], dict(data.get("env_kwargs") or {}), int(policy.get("max_episode_steps", 500))


def settings(steps: list[int], chunks: list[int]) -> list[tuple[int, int]]:
    return [(k, h) for k in steps for h in chunks]


def name(k: int, h: int) -> str:
    return f"K{k}_H{h}"


class ForwardCounter:
    """Counts the forwards of the VLM (prefix) and of the action expert with forward hooks."""

    def __init__(self, policy: Any) -> None:
        self.prefix = self.expert = 0
        model = policy.backbone.model
        self.handles = [model.vlm.register_forward_hook(self._on_prefix),
                        model.dit.register_forward_hook(self._on_expert)]  # fmt: skip

    def _on_prefix(self, *_: Any) -> None:
        self.prefix += 1

    def _on_expert(self, *_: Any) -> None:
        self.expert += 1

    def reset(self) -> None:
        self.prefix = self.expert = 0

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def make_envs(n: int, env_id: str, env_kwargs: dict[str, Any]) -> list[Any]:
    from fastlight.envs.registry import make_env

    return [make_env(env_id, env_kwargs=env_kwargs) for _ in range(n)]


def make_policy(folder: Path, k: int, h: int, env: Any, max_episode_steps: int, seed: int) -> Any:
    """The config's policy block on the pi0 folder, its instruction table bound from the env."""
    from fastlight.data.env_spec import EnvSpec, bind_instruction_table
    from fastlight.vla.flow_policy import FlowVLAPolicy

    spec = EnvSpec.from_env(env)
    torch.manual_seed(seed)
    policy = FlowVLAPolicy(
        backbone=str(folder), action_dim=spec.action_dim, action_chunk=h, num_steps=k, proprio_dim=STATE_DIM,
        max_episode_steps=max_episode_steps, value_mlp_hidden=64,
    ).eval()  # fmt: skip
    policy.check_obs_space(spec.observation_space)
    bind_instruction_table(policy, spec.instructions)
    return policy


def to_torch(obs: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    from fastlight.sampling.obs import stack_obs

    return {key: torch.as_tensor(v) for key, v in stack_obs(obs).items()}


def policy_cost(policies: dict[str, Any], obs: dict[str, torch.Tensor], *, reps: int, warmup: int) -> dict:
    """Median ``act`` time per setting, calls interleaved, and the forwards each call made."""
    n = int(obs["instruction_ids"].shape[0])
    step = torch.zeros(n, dtype=torch.long)
    counters = {s: ForwardCounter(p) for s, p in policies.items()}
    times: dict[str, list[float]] = {s: [] for s in policies}
    with torch.inference_mode():
        for _ in range(warmup):
            for p in policies.values():
                p.act(obs, step=step)
        for c in counters.values():
            c.reset()
        for _ in range(reps):
            for s, p in policies.items():
                t0 = time.perf_counter()
                p.act(obs, step=step)
                times[s].append(time.perf_counter() - t0)
    rows = {}
    for s, p in policies.items():
        c = counters[s]
        c.remove()
        k, h = p.num_steps, p.action_chunk
        ms = statistics.median(times[s]) * 1e3
        prefix, expert = c.prefix / reps, c.expert / reps
        rows[s] = {
            "num_steps": k, "action_chunk": h, "batch": n, "act_ms_median": round(ms, 2),
            "act_ms_min": round(min(times[s]) * 1e3, 2), "act_ms_max": round(max(times[s]) * 1e3, 2),
            "env_steps_per_call_per_env": h, "policy_ms_per_batch_step": round(ms / h, 3),
            "policy_ms_per_env_step": round(ms / (h * n), 4), "prefix_forwards_per_call": prefix,
            "expert_forwards_per_call": expert, "forwards_per_env_step": round((prefix + expert) / h, 4),
            "expected_forwards_per_call": 1 + k, "counted_matches": prefix == 1 and expert == k,
        }  # fmt: skip
    return rows


class Loop:
    """N envs and one policy: acts on the batch, each env runs its chunk, resets at episode ends."""

    def __init__(self, envs: list[Any], policy: Any, seed: int) -> None:
        self.envs, self.policy, self.h = envs, policy, policy.action_chunk
        self.obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
        self.steps = np.zeros(len(envs), dtype=np.int64)
        self.totals = {"env_steps": 0, "seconds": 0.0, "policy_s": 0.0, "env_step_s": 0.0, "reset_s": 0.0,
                       "episodes": 0, "calls": 0}  # fmt: skip

    def run(self, env_steps: int) -> None:
        t = self.totals
        done_steps, start = 0, time.perf_counter()
        with torch.inference_mode():
            while done_steps < env_steps:
                obs = to_torch(self.obs)
                t0 = time.perf_counter()
                out = self.policy.act(obs, step=torch.as_tensor(self.steps))
                actions = self.policy.env_action(out.actions).numpy()
                t["policy_s"] += time.perf_counter() - t0
                t["calls"] += 1
                actions = actions.reshape(len(self.envs), self.h, -1)
                for i, env in enumerate(self.envs):
                    for j in range(self.h):
                        t0 = time.perf_counter()
                        o, _, term, trunc, _ = env.step(actions[i, j])
                        t["env_step_s"] += time.perf_counter() - t0
                        done_steps += 1
                        self.steps[i] += 1
                        if term or trunc:
                            t0 = time.perf_counter()
                            o, _ = env.reset()
                            t["reset_s"] += time.perf_counter() - t0
                            t["episodes"] += 1
                            self.steps[i] = 0
                            break  # the rest of the chunk belongs to the ended episode
                    self.obs[i] = o
        t["env_steps"] += done_steps
        t["seconds"] += time.perf_counter() - start


def end_to_end(loops: dict[str, Loop], *, env_steps: int, rounds: int) -> dict:
    loads = []
    for loop in loops.values():  # first calls and lazy init out of the timing
        loop.run(1)
        loop.totals.update(env_steps=0, seconds=0.0, policy_s=0.0, env_step_s=0.0, reset_s=0.0, calls=0)
    for _ in range(rounds):
        for loop in loops.values():
            loop.run(env_steps)
        loads.append(load_avg())
    rows = {}
    for s, loop in loops.items():
        t = loop.totals
        sec = t["seconds"]
        rows[s] = {
            "num_steps": loop.policy.num_steps, "action_chunk": loop.h, "num_envs": len(loop.envs),
            "env_steps": t["env_steps"], "seconds": round(sec, 3), "calls": t["calls"],
            "env_steps_per_s": round(t["env_steps"] / sec, 1),
            "policy_share": round(t["policy_s"] / sec, 3), "env_step_share": round(t["env_step_s"] / sec, 3),
            "reset_share": round(t["reset_s"] / sec, 3),
            "other_share": round(1 - (t["policy_s"] + t["env_step_s"] + t["reset_s"]) / sec, 3),
            "env_step_ms": round(t["env_step_s"] / t["env_steps"] * 1e3, 3), "episodes": t["episodes"],
        }  # fmt: skip
    return {"rows": rows, "load_after_each_round": loads}


def table(result: dict) -> str:
    pc, e2e = result["policy_cost"]["rows"], result["end_to_end"]["rows"]
    n = next(iter(pc.values()))["batch"]
    lines = [
        f"Policy cost: one `act` call on N={n} observations, median of {result['settings']['reps']} "
        f"(load {result['policy_cost']['load_before']} -> {result['policy_cost']['load_after']})",
        "",
        "| K (num_steps) | H (action_chunk) | ms per act call (median) | min | "
        "env steps per call (per env) | policy ms per batch step | policy ms per env step | "
        "prefix + expert forwards per call | forwards per env step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in pc.values():
        check = "" if r["counted_matches"] else " (expected 1 + K!)"
        lines.append(
            f"| {r['num_steps']} | {r['action_chunk']} | {r['act_ms_median']:.1f} | {r['act_ms_min']:.1f} | "
            f"{r['action_chunk']} | "
            f"{r['policy_ms_per_batch_step']:.2f} | {r['policy_ms_per_env_step']:.3f} | "
            f"{r['prefix_forwards_per_call']:g} + {r['expert_forwards_per_call']:g}{check} | "
            f"{r['forwards_per_env_step']:.3g} |"
        )
    loads = result["end_to_end"]["load_after_each_round"]
    first = next(iter(e2e.values()))
    lines += [
        "",
        f"End to end: {first['num_envs']} envs of {result['env_id']}, {result['settings']['env_steps']} env "
        f"steps per setting per round, {result['settings']['rounds']} round(s) (load after each round: "
        f"{', '.join(map(str, loads))})",
        "",
        "| K | H | env steps/s | policy share | env.step share | reset share | other | env.step ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in e2e.values():
        lines.append(
            f"| {r['num_steps']} | {r['action_chunk']} | {r['env_steps_per_s']:.1f} | "
            f"{r['policy_share']:.0%} | {r['env_step_share']:.0%} | {r['reset_share']:.0%} | "
            f"{r['other_share']:.0%} | {r['env_step_ms']:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-steps", type=int, nargs="+", default=[10, 4], help="K values")
    ap.add_argument("--chunks", type=int, nargs="+", default=[8, 1], help="action_chunk values (<= 8)")
    ap.add_argument("--batch", type=int, default=8, help="N: observations per act call, envs end to end")
    ap.add_argument("--reps", type=int, default=40, help="timed act calls per setting")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--env-steps", type=int, default=1600, help="env steps per setting per round (all envs)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="writes <out>.json")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if max(args.chunks) > CHUNK_SIZE:
        raise SystemExit(f"--chunks: at most the folder's chunk_size {CHUNK_SIZE}")
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from benchmarks.tiny_vlm import save_tiny_pi0
    from fastlight.envs.instructions import INSTRUCTIONS

    env_id, env_kwargs, horizon = env_settings()
    combos = settings(args.num_steps, args.chunks)
    hf_logging.disable_progress_bar()  # the folder's save / load bars
    with tempfile.TemporaryDirectory(prefix="fastlight-tiny-pi0-") as tmp:
        folder = save_tiny_pi0(
            Path(tmp) / "pi0", sentences=list(INSTRUCTIONS.values()), chunk_size=CHUNK_SIZE,
            action_dim=ACTION_DIM, state_dim=STATE_DIM, seed=args.seed,
        )  # fmt: skip
        loops = {}
        for k, h in combos:
            envs = make_envs(args.batch, env_id, env_kwargs)
            loops[name(k, h)] = Loop(envs, make_policy(folder, k, h, envs[0], horizon, args.seed), args.seed)
    policies = {s: loop.policy for s, loop in loops.items()}
    obs = to_torch(next(iter(loops.values())).obs)  # N reset observations of the config's env
    before = load_avg()
    pc = policy_cost(policies, obs, reps=args.reps, warmup=args.warmup)
    policy = {"rows": pc, "load_before": before, "load_after": load_avg()}
    e2e = end_to_end(loops, env_steps=args.env_steps, rounds=args.rounds)
    for loop in loops.values():
        for env in loop.envs:
            env.close()
    result = {
        "command": " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch threads {args.threads}",
        "model": f"tiny random pi0 (save_tiny_pi0: chunk_size {CHUNK_SIZE}, action_dim {ACTION_DIM}, "
        f"state_dim {STATE_DIM}, hidden 32, 2 layers), state + instruction",
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "settings": {
            "num_steps": args.num_steps,
            "chunks": args.chunks,
            "batch": args.batch,
            "reps": args.reps,
            "env_steps": args.env_steps,
            "rounds": args.rounds,
        },  # fmt: skip
        "policy_cost": policy,
        "end_to_end": e2e,
    }
    result["table"] = table(result)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    return result


if __name__ == "__main__":
    main()
