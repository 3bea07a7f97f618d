"""Image mode per VLM family: where an env step's time goes (render / preprocess / tower / rest of ``act``).

    python -m benchmarks.vla.image_split                      # the split, every family
    python -m benchmarks.vla.image_split --throughput-seconds 10   # + hf_throughput's env steps/s

For each tiny random family of :func:`benchmarks.tiny_vlm.save_tiny_vlm` (hidden 64, 64x64 tower input)
and a batch of 8 ``fastlight/MetaWorld-v0`` MT10 envs, one torch thread, per env step (medians):

- **step** / **render**: ``env.step`` of the state-only env (``image=False``) and of the image env
  (``image=True``, 64x64 frame drawn offscreen inside ``step``); render = the difference. The env part
  does not depend on the family, but the machine's load does: it is measured again just before each
  family's policy timing, the two env kinds interleaved rep by rep (the same 16 envs throughout);
- **preprocess**, **tower**: inside real ``VLAPolicy.act`` calls on the 8 envs' observations, the
  folder's image processor and the model's ``get_image_features`` are wrapped in timers (the calls
  :func:`fastlight.vla.hf_vlm.image_features` makes, unchanged); **act** is the whole call and **rest**
  = act - preprocess - tower (instruction lookup, decoder, heads, sampling). A call serves 8 envs: its
  times are divided by 8 per env step (``action_chunk`` 1: one call per env step).

Shares are of the modelled env step ``step + render + act / 8``; the Collector's own bookkeeping is not
in it (``--throughput-seconds`` runs :func:`benchmarks.vla.hf_throughput.compare`'s image variant per
family, the measured env steps/s, for comparison).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

os.environ.setdefault("MUJOCO_GL", "egl")

COMMAND = "python -m benchmarks.vla.image_split"
NUM_ENVS = 8


class _TimedCall:
    """``inner`` with every call's wall time appended to ``times``; other attributes pass through (the
    processor's ``backend``, which :func:`~fastlight.vla.hf_vlm.image_features` reads)."""

    def __init__(self, inner: Any, times: list[float]) -> None:
        self.inner, self.times = inner, times

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = self.inner(*args, **kwargs)
        self.times.append(time.perf_counter() - t0)
        return out


def _timed_method(method: Any, times: list[float]) -> Any:
    """A timed wrapper of a bound method whose ``inspect.signature`` is the method's (``__wrapped__``):
    ``image_features`` picks the processor outputs to pass by that signature."""

    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = method(*args, **kwargs)
        times.append(time.perf_counter() - t0)
        return out

    return timed


def make_envs(image: bool, horizon: int) -> list[Any]:
    from fastlight.envs.registry import make_env

    kwargs = {"tasks": "MT10", "image": image, "max_path_length": horizon}
    return [make_env("fastlight/MetaWorld-v0", env_kwargs=kwargs) for _ in range(NUM_ENVS)]


def env_block(envs: list[Any], obs: list[Any], rng: np.random.Generator, steps: int) -> float:
    """Seconds per env step of ``steps`` steps of every env (random actions; resets not timed)."""
    spent = 0.0
    for _ in range(steps):
        for i, env in enumerate(envs):
            action = rng.uniform(-1.0, 1.0, 4).astype(np.float32)
            t0 = time.perf_counter()
            o, _, term, trunc, _ = env.step(action)
            spent += time.perf_counter() - t0
            obs[i] = env.reset()[0] if term or trunc else o
    return spent / (steps * len(envs))


class EnvBench:
    """8 state-only and 8 image envs, reset once; :meth:`measure` times them interleaved rep by rep."""

    def __init__(self, horizon: int, seed: int) -> None:
        self.kinds = {"step": make_envs(False, horizon), "step_render": make_envs(True, horizon)}
        self.obs = {k: [e.reset(seed=seed + i)[0] for i, e in enumerate(v)] for k, v in self.kinds.items()}
        self.rng = np.random.default_rng(seed)
        for k, envs in self.kinds.items():  # first frames, lazy contexts: out of the timing
            env_block(envs, self.obs[k], self.rng, 2)

    def measure(self, reps: int, steps: int) -> dict[str, float]:
        """Median seconds per env step of each kind, and render = their difference."""
        times: dict[str, list[float]] = {k: [] for k in self.kinds}
        for _ in range(reps):
            for k, envs in self.kinds.items():
                times[k].append(env_block(envs, self.obs[k], self.rng, steps))
        med = {k: statistics.median(v) for k, v in times.items()}
        med["render"] = med["step_render"] - med["step"]
        return med

    def close(self) -> None:
        for envs in self.kinds.values():
            for env in envs:
                env.close()


def measure_policy(folder: Path, spec: Any, batch: dict[str, torch.Tensor], calls: int) -> dict[str, Any]:
    """Median seconds of ``act`` on ``batch`` and of its processor / ``get_image_features`` calls."""
    from fastlight.data.env_spec import bind_instruction_table
    from fastlight.vla.policy import VLAPolicy

    policy = VLAPolicy(backbone=str(folder), action_dim=4, proprio_dim=39, image_size=64).eval()
    policy.check_obs_space(spec.observation_space)
    bind_instruction_table(policy, spec.instructions)
    prep: list[float] = []
    tower: list[float] = []
    policy.image_processor = _TimedCall(policy.image_processor, prep)
    model = policy.backbone
    model.get_image_features = _timed_method(model.get_image_features, tower)
    acts: list[float] = []
    with torch.inference_mode():
        for _ in range(2):  # lazy init, capture hooks: out of the timing
            policy.act(batch)
        prep.clear()
        tower.clear()
        for _ in range(calls):
            t0 = time.perf_counter()
            policy.act(batch)
            acts.append(time.perf_counter() - t0)
        pixels = policy.image_processor.inner(
            images=[[im] for im in batch["image"]], return_tensors="pt", input_data_format="channels_last"
        )
    if len(prep) != calls or len(tower) != calls:
        raise RuntimeError(
            f"expected one processor and one tower call per act, got {len(prep)}, {len(tower)}"
        )
    act, pre, tow = (statistics.median(v) for v in (acts, prep, tower))
    pv = pixels.get("pixel_values")
    return {
        "act": act,
        "preprocess": pre,
        "tower": tow,
        "rest": act - pre - tow,
        "pixel_values": list(pv.shape) if pv is not None else None,
        "policy_rows_per_s": round(NUM_ENVS / act, 1),
    }


def row(arch: str, env: dict[str, float], pol: dict[str, Any]) -> dict[str, Any]:
    """Per env step (ms) and shares of ``step + render + act / 8``."""
    per = {
        "step": env["step"],
        "render": env["render"],
        "preprocess": pol["preprocess"] / NUM_ENVS,
        "tower": pol["tower"] / NUM_ENVS,
        "rest": pol["rest"] / NUM_ENVS,
    }
    total = sum(per.values())
    return {
        "arch": arch,
        "ms_per_env_step": {k: round(1e3 * v, 3) for k, v in per.items()},
        "act_ms_batch8": round(1e3 * pol["act"], 2),
        "preprocess_ms_batch8": round(1e3 * pol["preprocess"], 2),
        "tower_ms_batch8": round(1e3 * pol["tower"], 2),
        "pixel_values": pol["pixel_values"],
        "policy_rows_per_s": pol["policy_rows_per_s"],
        "model_ms_per_env_step": round(1e3 * total, 2),
        "model_env_steps_per_s": round(1.0 / total, 1),
        "shares_pct": {k: round(100 * v / total, 1) for k, v in per.items()},
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| family | pixel_values (8 frames) | act (8 obs), ms | preprocess, ms/step | tower, ms/step | "
        "rest of act, ms/step | step, ms | render, ms | modelled steps/s | measured steps/s | "
        "shares step / render / preprocess / tower / rest, % |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        m, s = r["ms_per_env_step"], r["shares_pct"]
        measured = r.get("measured_env_steps_per_s", "-")
        shares = " / ".join(f"{s[k]:.0f}" for k in ("step", "render", "preprocess", "tower", "rest"))
        lines.append(
            f"| {r['arch']} | {r['pixel_values']} | {r['act_ms_batch8']:.1f} | {m['preprocess']:.2f} | "
            f"{m['tower']:.2f} | {m['rest']:.2f} | {m['step']:.2f} | {m['render']:.2f} | "
            f"{r['model_env_steps_per_s']:.1f} | {measured} | {shares} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=None, help="comma-separated save_tiny_vlm archs (default: all)")
    ap.add_argument("--reps", type=int, default=3, help="env repetitions (median over them)")
    ap.add_argument("--steps", type=int, default=10, help="steps of each of the 8 envs per env repetition")
    ap.add_argument("--calls", type=int, default=15, help="timed act calls per family (median over them)")
    ap.add_argument("--horizon", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--throughput-seconds", type=float, default=0.0, help="> 0: also hf_throughput's image mode"
    )
    ap.add_argument("--out", default=None, help="also write the result as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from benchmarks.tiny_vlm import ARCHITECTURES, save_tiny_vlm
    from fastlight.data.env_spec import EnvSpec
    from fastlight.envs.instructions import INSTRUCTIONS
    from fastlight.sampling.obs import obs_to_tensor, stack_obs

    archs = args.families.split(",") if args.families else list(ARCHITECTURES)
    load = [open("/proc/loadavg").read().split()[:3]] if os.path.exists("/proc/loadavg") else []
    bench = EnvBench(args.horizon, args.seed)
    batch = obs_to_tensor(stack_obs(bench.obs["step_render"]))  # the same 8 frames for every family
    from fastlight.envs.registry import make_env

    probe = make_env(
        "fastlight/MetaWorld-v0", env_kwargs={"tasks": "MT10", "image": True, "max_path_length": args.horizon}
    )
    spec = EnvSpec.from_env(probe)  # a probe env never starts MuJoCo
    rows = []
    with tempfile.TemporaryDirectory(prefix="fastlight-image-split-") as tmp:
        for arch in archs:
            folder = save_tiny_vlm(
                arch, Path(tmp) / arch, sentences=list(INSTRUCTIONS.values()), image_size=64, hidden_size=64
            )
            env = bench.measure(args.reps, args.steps)  # next to this family's policy timing
            r = row(arch, env, measure_policy(folder, spec, batch, args.calls))
            if args.throughput_seconds > 0:
                from benchmarks.vla.hf_throughput import compare

                cfg = {
                    "image": True,
                    "chunk": 1,
                    "num_envs": NUM_ENVS,
                    "horizon": args.horizon,
                    "seed": args.seed,
                }
                res = compare(folder, {"image": cfg}, seconds=args.throughput_seconds, rounds=1)["image"]
                r["measured_env_steps_per_s"] = res["env_steps_per_s"]
                r["measured_env_steps"], r["measured_seconds"] = res["env_steps"], res["seconds"]
            r["loadavg"] = (
                open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else None
            )
            rows.append(r)
            print(json.dumps(r), flush=True)
    bench.close()
    load.append(open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else None)
    result = {
        "command": " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])]),
        "machine": f"{os.cpu_count()} cores, torch threads 1",
        "loadavg_start_end": load,
        "rows": rows,
    }
    print(markdown(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
