"""MT10 sampling throughput of a VLA over a Hugging Face vision-language backbone, measured interleaved.

    python -m benchmarks.vla.hf_throughput --seconds 20 --rounds 3 --out benchmarks/results/vla_hf_throughput

Two comparisons, each in one process, alternating its variants round by round so both see the same
machine state (a shared 2-core machine drifts 2x between runs):

- **image mode**: ``fastlight/MetaWorld-v0`` MT10 rendering a 64x64 camera frame per step (MuJoCo on
  the CPU, ``MUJOCO_GL=egl``), the frame going through the backbone's own vision tower and projector
  (prepared as its saved image processor does, on the batch), against the same model on the
  state-only env (no rendering, no tower): what images cost per env step;
- **chunking**: the state-only env with ``action_chunk`` 1 and 8 (same backbone, same envs): env
  steps/s and policy forwards per env step (``act`` and bootstrap ``value`` rows counted: one row is
  one env's forward inside a batched call; ``calls_per_env_step`` counts the batched calls).

Every variant samples through :class:`~fastlight.sampling.collector.Collector` exactly as a sampler
process does (DPSA cycles, the policy acting under ``inference_mode``), in this one process with the
policy on the CPU. The backbone is :func:`benchmarks.tiny_vlm.save_tiny_vlm`'s random Llava
(CLIP tower + Llama, hidden ``--hidden``): the numbers are the framework's and the simulator's costs
at a tiny model size, not a real VLA's compute.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("MUJOCO_GL", "egl")

COMMAND = "python -m benchmarks.vla.hf_throughput"


class CountingPolicy:
    """A :class:`~fastlight.models.base.Policy` that counts the forwards the sampler asks for."""

    def __init__(self, policy: Any) -> None:
        self.policy, self.forwards, self.rows = policy, 0, 0

    def _count(self, obs: dict) -> None:
        self.forwards += 1  # one batched call
        self.rows += int(obs["instruction_ids"].shape[0])  # the envs it answers for

    def act(self, obs, *, step=None, deterministic=False):
        self._count(obs)
        return self.policy.act(obs, step=step, deterministic=deterministic)

    def evaluate(self, obs, actions, *, step=None):
        return self.policy.evaluate(obs, actions, step=step)

    def value(self, obs, *, step=None):
        self._count(obs)
        return self.policy.value(obs, step=step)

    def action_mapping(self):
        return self.policy.action_mapping()

    def env_action(self, actions):
        return self.policy.env_action(actions)


def make_variant(folder: Path, *, image: bool, chunk: int, num_envs: int, horizon: int, seed: int) -> dict:
    """Envs, a Collector and a bound VLAPolicy for one variant."""
    from fastlight.data.env_spec import EnvSpec, bind_instruction_table
    from fastlight.envs.registry import make_env
    from fastlight.sampling.collector import Collector
    from fastlight.vla.policy import VLAPolicy

    kwargs = {"tasks": "MT10", "image": image, "max_path_length": horizon}
    envs = [make_env("fastlight/MetaWorld-v0", env_kwargs=kwargs) for _ in range(num_envs)]
    spec = EnvSpec.from_env(envs[0])
    torch.manual_seed(seed)
    policy = VLAPolicy(
        backbone=str(folder), action_dim=spec.action_dim, proprio_dim=39,
        image_size=64 if image else None, max_episode_steps=horizon, action_chunk=chunk,
    ).eval()  # fmt: skip
    policy.check_obs_space(spec.observation_space)
    bind_instruction_table(policy, spec.instructions)
    collector = Collector(envs, mode="dpsa", termination_threshold=0.5, max_horizon=horizon, seed=seed)
    return {"policy": CountingPolicy(policy), "collector": collector, "env_steps": 0, "seconds": 0.0}


def run_block(v: dict, seconds: float) -> None:
    """Collect for about ``seconds``: env steps (not chunks) and wall time are added to ``v``."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - t0 < seconds:
            rollout = v["collector"].collect(v["policy"])
            v["env_steps"] += int(rollout.stats.raw_steps)
    v["seconds"] += time.perf_counter() - t0


def compare(folder: Path, variants: dict[str, dict], *, seconds: float, rounds: int) -> dict[str, Any]:
    built = {name: make_variant(folder, **cfg) for name, cfg in variants.items()}
    for v in built.values():  # first resets, lazy torch init and the tower's first call out of the timing
        run_block(v, 0.0)
        v.update(env_steps=0, seconds=0.0)
        v["policy"].forwards = v["policy"].rows = 0
    for _ in range(rounds):
        for v in built.values():
            run_block(v, seconds)
    out = {}
    for name, v in built.items():
        v["collector"].close()
        out[name] = {
            **variants[name],
            "env_steps": v["env_steps"],
            "seconds": round(v["seconds"], 2),
            "env_steps_per_s": round(v["env_steps"] / v["seconds"], 1),
            # batched calls per env step, and rows (one env's forward) per env step
            "calls_per_env_step": round(v["policy"].forwards / max(v["env_steps"], 1), 4),
            "forwards_per_env_step": round(v["policy"].rows / max(v["env_steps"], 1), 4),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="wall seconds per variant per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--horizon", type=int, default=150)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/vla_hf_throughput")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # a sampler process's setting: one core each
    from benchmarks.tiny_vlm import save_tiny_vlm
    from fastlight.envs.instructions import INSTRUCTIONS

    common = {"num_envs": args.num_envs, "horizon": args.horizon, "seed": args.seed}
    with tempfile.TemporaryDirectory(prefix="fastlight-tiny-llava-") as tmp:
        folder = save_tiny_vlm(
            "llava", Path(tmp) / "llava", sentences=list(INSTRUCTIONS.values()), image_size=64,
            hidden_size=args.hidden,
        )  # fmt: skip
        state = {"image": False, "chunk": 1, **common}
        image = {"image": {**state, "image": True}, "state": state}
        image = compare(folder, image, seconds=args.seconds, rounds=args.rounds)
        chunks = {"chunk1": state, "chunk8": {**state, "chunk": 8}}
        chunks = compare(folder, chunks, seconds=args.seconds, rounds=args.rounds)
    result = {
        "command": " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads 1",
        "backbone": f"tiny random llava (save_tiny_vlm, hidden {args.hidden}, vision input 64x64)",
        "image_mode": image,
        "chunking": chunks,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
