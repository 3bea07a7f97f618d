"""``fastlight evaluate``: play a checkpoint's policy for full episodes and report how it does.

    fastlight evaluate --ckpt runs/highway_dpsa/checkpoints/last.ckpt --episodes 20
    fastlight evaluate --ckpt runs/highway_dpsa/checkpoints/last.ckpt --episodes 3 --video runs/videos
    fastlight evaluate --ckpt runs/vla_metaworld_mt10/checkpoints/last.ckpt --episodes 5  # 5 per task

The env is rebuilt from the checkpoint's own data-module settings (``env_id`` / ``env_kwargs``;
``--env`` / ``--env-kwargs`` override or supply them). Episodes run to their natural end
(termination or the env's own time limit): no DPSA unified truncation and no emulated
scenario-load cost, so returns compare across runs and with the literature. Episode ``i`` is reset
with seed ``--seed + i`` (fastlight's multi-task Meta-World: :func:`fastlight.evaluation.eval_seed`,
``--episodes`` per task), so two checkpoints evaluated with one seed face the same episodes.

Reported (95%): mean return with a percentile-bootstrap interval (10,000 resamples of the
episodes, :func:`fastlight.bench.vla_eval.bootstrap_mean_ci`), mean episode length, and the
success rate (``info['is_success']`` or ``info['success']``) and crash rate (highway-env's
``info['crashed']``) with Wilson score intervals, each where the env reports it. Printed, and
written with one row per episode to ``--out`` (default ``<ckpt>.eval.json``). ``--video DIR``
writes one GIF per episode (imageio, from the optional ``bench`` extra).

Any fastlight module class loads: the checkpoint records its class path (LightningCLI's
``_class_path``), imported from the working directory like ``fastlight fit`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import gymnasium as gym
import numpy as np

if TYPE_CHECKING:
    from fastlight.evaluation import TaskEpisode

from fastlight.cli_output import OneLineArgumentParser
from fastlight.cli_output import fail as cli_fail

PROG = "fastlight evaluate"
#: Longest episode played when the env sets no time limit of its own (nothing runs forever).
MAX_EPISODE_STEPS = 10_000
N_BOOT = 10_000


@dataclass
class EvalEpisode:
    """One evaluation episode, played to its natural end. ``None``: the env does not report it."""

    index: int
    seed: int
    length: int = 0
    ret: float = 0.0
    terminated: bool | None = None  # None: not recorded (the multi-task path)
    truncated: bool | None = None
    success: bool | None = None
    crashed: bool | None = None
    task: str | None = None
    frames: list[np.ndarray] = field(default_factory=list, repr=False)


def fail(message: str) -> NoReturn:
    cli_fail(message, prog=PROG)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ckpt", required=True, metavar="PATH", help="checkpoint of any fastlight module")
    p.add_argument("--episodes", type=int, default=10, help="episodes (per task for a multi-task env)")
    p.add_argument("--seed", type=int, default=10_000, help="episode i is reset with seed + i")
    p.add_argument("--video", metavar="DIR", help="write one GIF per episode here (needs the bench extra)")
    p.add_argument("--fps", type=float, help="GIF frame rate (default: the env's render_fps, at most 30)")
    p.add_argument("--out", metavar="FILE.json", help="results file (default: <ckpt>.eval.json)")
    p.add_argument("--sample", action="store_true", help="sample actions instead of the greedy one")
    p.add_argument("--env", metavar="ID", help="gymnasium id, instead of the checkpoint's data.env_id")
    p.add_argument("--env-kwargs", metavar="JSON", help="merged over the checkpoint's data.env_kwargs")
    p.add_argument("--batch", type=int, default=4, help="multi-task env: episodes of a task in lockstep")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse and check everything that needs no file read."""
    args = build_parser().parse_args(argv)
    for flag, value in (("--episodes", args.episodes), ("--batch", args.batch)):
        if value < 1:
            fail(f"{flag} must be >= 1, got {value}")
    if args.fps is not None and not 0 < args.fps <= 100:
        fail(f"--fps must be in (0, 100], got {args.fps}")
    args.env_override = {}
    if args.env_kwargs is not None:
        try:
            args.env_override = json.loads(args.env_kwargs)
        except json.JSONDecodeError as e:
            fail(f"--env-kwargs must be a JSON object, got {args.env_kwargs!r} ({e})")
        if not isinstance(args.env_override, dict):
            fail(f"--env-kwargs must be a JSON object, got {args.env_kwargs!r}")
    if args.out is not None and not args.out.endswith(".json"):
        fail(f"--out must name a .json file, got {args.out!r}")
    return args


# ---------------------------------------------------------------------- checkpoint
def load_checkpoint(path: str) -> tuple[Any, dict[str, Any]]:
    """``(module on the CPU in eval mode, checkpoint dict)``; every failure names ``--ckpt``."""
    from fastlight.checkpoints import read_checkpoint

    ckpt = read_checkpoint(path, flag="--ckpt")
    return load_module_of(path, ckpt), ckpt


def load_module_of(path: str, ckpt: dict[str, Any]) -> Any:
    """The module of checkpoint ``path`` (already read as ``ckpt``), of the class it records."""
    import torch

    from fastlight.checkpoints import module_class
    from fastlight.modules.rl_module import RLModule

    class_path = (ckpt.get("hyper_parameters") or {}).get("_class_path")
    try:
        cls = module_class(ckpt, RLModule)
    except (ImportError, AttributeError) as e:
        raise ValueError(
            f"--ckpt: cannot import the checkpoint's module class {class_path!r} ({type(e).__name__}: {e}); "
            "run from the directory that holds its package, or add that directory to PYTHONPATH"
        ) from e
    try:
        module = cls.load_from_checkpoint(path, map_location="cpu")
    except (RuntimeError, TypeError, KeyError) as e:
        recorded = "" if class_path else " (it records no class path, so it was loaded as RLModule)"
        raise ValueError(
            f"--ckpt: cannot rebuild {cls.__module__}.{cls.__qualname__} from {path}{recorded}: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    module.eval()
    if not isinstance(module._modules.get("policy"), torch.nn.Module):
        raise ValueError(f"--ckpt: {cls.__qualname__} has no policy to evaluate")
    return module


def env_settings(ckpt: dict[str, Any], env_id: str | None, override: dict[str, Any]) -> tuple[str, dict]:
    """The checkpoint's ``(env_id, env_kwargs)`` with the command line's over them."""
    data = ckpt.get("datamodule_hyper_parameters") or {}
    env_id = env_id or data.get("env_id")
    if not env_id:
        raise ValueError("--env: the checkpoint records no env (no data.env_id); give one with --env ID")
    return env_id, {**(data.get("env_kwargs") or {}), **override}


# ---------------------------------------------------------------------- playing
def play_episodes(act: Any, env: gym.Env, *, episodes: int, seed: int, record: bool) -> list[EvalEpisode]:
    """Episode ``i`` on seed ``seed + i``, to its natural end; ``record`` keeps ``env.render()`` frames.

    ``act`` is :func:`fastlight.evaluation.policy_act_fn`'s ``(obs, step) -> env action``; ``env``
    is closed at the end. Without a time limit of its own an episode stops at ``MAX_EPISODE_STEPS``.
    """
    limit = MAX_EPISODE_STEPS if env.spec is None or env.spec.max_episode_steps is None else None
    out = []
    try:
        for i in range(episodes):
            ep = EvalEpisode(index=i, seed=seed + i)
            obs, _ = env.reset(seed=ep.seed)
            if record:
                ep.frames.append(np.asarray(env.render()))
            done = False
            while not done:
                obs, reward, term, trunc, info = env.step(act(obs, ep.length))
                ep.length += 1
                ep.ret += float(reward)
                _read_outcome(ep, info)
                if record:
                    ep.frames.append(np.asarray(env.render()))
                capped = limit is not None and ep.length >= limit  # counts as a time limit
                ep.terminated, ep.truncated = bool(term), bool(trunc) or capped
                done = ep.terminated or ep.truncated
            out.append(ep)
    finally:
        env.close()
    return out


def _read_outcome(ep: EvalEpisode, info: dict[str, Any]) -> None:
    """Success: any step says so (Meta-World reports it on the step it happens). Crash: the last step."""
    for key in ("is_success", "success"):
        if key in info:
            ep.success = bool(ep.success) or bool(info[key])
    if "crashed" in info:
        ep.crashed = bool(info["crashed"])


def play_multitask(
    policy: Any, env_id: str, env_kwargs: dict[str, Any], args: argparse.Namespace, *, record: bool
) -> tuple[list[EvalEpisode], list[TaskEpisode]]:
    """fastlight's Meta-World: :func:`fastlight.evaluation.play_tasks`, ``--episodes`` per task."""
    from fastlight.evaluation import play_tasks, policy_batch_act_fn

    eps = play_tasks(
        policy_batch_act_fn(policy, deterministic=not args.sample),
        env_id=env_id,
        env_kwargs=env_kwargs,
        episodes_per_task=args.episodes,
        seed=args.seed,
        batch=args.batch,
        record=args.episodes if record else 0,
    )
    mine = [
        EvalEpisode(i, e.seed, e.length, e.ret, success=e.success, task=e.task, frames=e.frames)
        for i, e in enumerate(eps)
    ]
    return mine, eps


# ---------------------------------------------------------------------- statistics and output
def summarise(episodes: list[EvalEpisode], *, seed: int) -> dict[str, Any]:
    """Mean return (bootstrap CI), mean length, success / crash rates (Wilson CIs) where reported."""
    from fastlight.bench.vla_eval import bootstrap_mean_ci, wilson_interval

    returns = np.asarray([e.ret for e in episodes], dtype=np.float64)
    mean, low, high = bootstrap_mean_ci({"all": returns}, n_boot=N_BOOT, seed=seed)
    out: dict[str, Any] = {
        "episodes": len(episodes),
        "return": {"mean": mean, "ci_low": low, "ci_high": high, "std": float(returns.std())},
        "length": {"mean": float(np.mean([e.length for e in episodes]))},
        "return_ci": "95% percentile bootstrap of the mean over episodes (10,000 resamples)",
    }
    for key, seen in (
        ("success_rate", [e.success for e in episodes if e.success is not None]),
        ("crash_rate", [e.crashed for e in episodes if e.crashed is not None]),
    ):
        if len(seen) < len(episodes):
            out[key] = None  # the env does not report it (on every episode)
            continue
        k = int(sum(seen))
        lo, hi = wilson_interval(k, len(seen))
        out[key] = {"rate": k / len(seen), "ci_low": lo, "ci_high": hi, "count": k}
    return out


def write_gifs(directory: Path, episodes: list[EvalEpisode], fps: float) -> list[str]:
    """``episode_<i>[_<task>]_seed<seed>.gif`` for every episode that kept frames."""
    import imageio.v3 as iio

    written = []
    for e in episodes:
        if len(e.frames) < 1:
            continue
        directory.mkdir(parents=True, exist_ok=True)
        name = f"episode_{e.index:03d}" + (f"_{e.task}" if e.task else "") + f"_seed{e.seed}.gif"
        # Pillow's GIF writer takes the frame duration in milliseconds; loop=0 repeats forever.
        iio.imwrite(directory / name, np.stack(e.frames), extension=".gif", duration=1000.0 / fps, loop=0)
        written.append(str(directory / name))
    return written


def _row(e: EvalEpisode) -> dict[str, Any]:
    """An episode as a JSON row (``return``, not the attribute's ``ret``; no frames)."""
    row = {k: v for k, v in asdict(e).items() if k not in ("frames", "ret")}
    return {**row, "return": e.ret}


def _fmt_rate(r: dict[str, float] | None) -> str:
    return (
        "not reported by the env" if r is None else f"{r['rate']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
    )


def report(result: dict[str, Any]) -> str:
    s = result["summary"]
    r = s["return"]
    return "\n".join(
        [
            f"{PROG}: {result['ckpt']} ({result['module']}, policy_version {result['policy_version']}) "
            f"on {result['env_id']}, {s['episodes']} episodes from seed {result['seed']}, "
            f"{'sampled' if result['sample'] else 'greedy'} actions",
            f"  mean return     {r['mean']:.3f}  95% CI [{r['ci_low']:.3f}, {r['ci_high']:.3f}] (bootstrap)",
            f"  mean length     {s['length']['mean']:.1f} steps",
            f"  success rate    {_fmt_rate(s['success_rate'])}",
            f"  crash rate      {_fmt_rate(s['crash_rate'])}",
        ]
    )


# ---------------------------------------------------------------------- command
def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run ``fastlight evaluate`` (``argv`` without the subcommand); returns what it writes."""
    args = parse(list(sys.argv[2:] if argv is None else argv))
    # Like `fastlight fit`: class paths of the project being run (examples.*, a user's package).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if args.video:
        from fastlight.bench.extras import require

        try:  # before the (long) evaluation
            require("imageio", command=f"{PROG} --video")
        except ModuleNotFoundError as e:
            fail(str(e))
    from fastlight.bench.vla_eval import probe_env
    from fastlight.checkpoints import read_checkpoint
    from fastlight.envs.registry import check_env_id

    try:
        ckpt = read_checkpoint(args.ckpt, flag="--ckpt")
        env_id, env_kwargs = env_settings(ckpt, args.env, args.env_override)
        check_env_id(env_id, flag="--env")  # before the (possibly large) model is built
        module = load_module_of(args.ckpt, ckpt)
        task_names, image_mode = probe_env(env_id, env_kwargs)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e).splitlines()[0])
    return _evaluate(args, module, ckpt, env_id, env_kwargs, task_names, image_mode)


def _evaluate(
    args: argparse.Namespace,
    module: Any,
    ckpt: dict[str, Any],
    env_id: str,
    env_kwargs: dict[str, Any],
    task_names: tuple[str, ...],
    image_mode: bool,
) -> dict[str, Any]:
    import torch

    from fastlight.envs.registry import make_env
    from fastlight.evaluation import policy_act_fn

    torch.manual_seed(args.seed)  # --sample: reproducible
    video_note = None
    task_eps: list[TaskEpisode] = []
    if task_names:
        record = bool(args.video) and image_mode
        if args.video and not image_mode:
            video_note = "--video: state mode has no camera frames; image mode is data.env_kwargs.image: true"
            print(f"{PROG}: {video_note}", file=sys.stderr)
        episodes, task_eps = play_multitask(module.policy, env_id, env_kwargs, args, record=record)
        fps = args.fps or 20.0
    else:
        if args.video:
            # rgb_array frames need no window: SDL's offscreen driver draws without looking for a
            # display (not "dummy": highway-env then stops drawing, every frame the first one).
            os.environ.setdefault("SDL_VIDEODRIVER", "offscreen")
        kwargs = {**env_kwargs, "render_mode": "rgb_array"} if args.video else env_kwargs
        env = make_env(env_id, env_kwargs=kwargs, flag="--env")
        fps = args.fps or float(min(max(env.metadata.get("render_fps") or 20, 1), 30))
        act = policy_act_fn(module.policy, deterministic=not args.sample)
        episodes = play_episodes(act, env, episodes=args.episodes, seed=args.seed, record=bool(args.video))
    videos = write_gifs(Path(args.video), episodes, fps) if args.video else []
    version = ckpt["state_dict"].get("_policy_version")
    result: dict[str, Any] = {
        "ckpt": args.ckpt,
        "module": (ckpt.get("hyper_parameters") or {}).get("_class_path") or type(module).__name__,
        "policy_version": None if version is None else int(version),
        "global_step": ckpt.get("global_step"),
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "task_names": list(task_names),
        "seed": args.seed,
        "sample": args.sample,
        "summary": summarise(episodes, seed=args.seed),
        "videos": videos,
        "video_note": video_note,
        "episodes": [_row(e) for e in episodes],
    }
    if task_names:
        from fastlight.bench.vla_eval import summarise as per_task_summary

        result["per_task"] = per_task_summary(task_eps, task_names, n_boot=N_BOOT, seed=args.seed)
    out = Path(args.out or str(Path(args.ckpt).with_suffix("")) + ".eval.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(report(result))
    print(f"{PROG}: wrote {out}" + (f" and {len(videos)} GIFs under {args.video}" if videos else ""))
    return result
