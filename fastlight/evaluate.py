"""``fastlight evaluate``: play a checkpoint's policy for full episodes and report how it does.

    fastlight evaluate --ckpt runs/highway_dpsa/checkpoints/last.ckpt --episodes 20
    fastlight evaluate --ckpt runs/highway_dpsa/checkpoints/last.ckpt --episodes 3 --video runs/videos
    fastlight evaluate --ckpt runs/vla_metaworld_mt10/checkpoints/last.ckpt --episodes 5  # 5 per task

The env is rebuilt from the checkpoint's own data-module settings (``--env`` / ``--env-kwargs``
override or supply them), inside its gymnasium ``env_wrappers``. Episodes run to their natural end
(:mod:`fastlight.evaluation`); episode ``i`` is reset with seed ``--seed + i`` (multi-task Meta-World:
``--episodes`` per task), so two checkpoints evaluated with one seed face the same episodes.

Reported (95%): mean return with a percentile-bootstrap interval over episodes, mean length, and the
success and crash rates with Wilson score intervals where the env reports them. On highway-env (or
with ``--metrics driving``) FAST's closed-loop driving metrics too (§5). Printed, and written with one
row per episode to ``--out`` (default: ``<ckpt>.eval-<date>-<time>-seed<seed>.json``, the latest also
as ``<ckpt>.eval.json``). ``--video DIR`` writes one GIF per episode (the optional ``bench`` extra).
Any fastlight module class loads: the checkpoint records its class path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

if TYPE_CHECKING:
    from fastlight.metrics.driving import DrivingEpisode
    from fastlight.rollout import EpisodeRecord

from fastlight.cli_output import OneLineArgumentParser
from fastlight.cli_output import fail as cli_fail

PROG = "fastlight evaluate"
N_BOOT = 10_000


def progress_line(every_s: float = 10.0) -> Callable[[int, int], None]:
    """A ``progress(done, total)`` that prints ``fastlight evaluate: 40 of 200 episodes, 35 s`` to stderr
    at most every ``every_s`` seconds, and at the end."""
    start = last = time.monotonic()

    def show(done: int, total: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= every_s or done == total:
            last = now
            print(f"{PROG}: {done} of {total} episodes, {now - start:.0f} s", file=sys.stderr, flush=True)

    return show


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
    out_help = "results file (default: one per call beside the checkpoint, the latest also <ckpt>.eval.json)"
    p.add_argument("--out", metavar="FILE.json", help=out_help)
    p.add_argument("--sample", action="store_true", help="sample actions instead of the greedy one")
    p.add_argument("--env", metavar="ID", help="gymnasium id, instead of the checkpoint's data.env_id")
    p.add_argument("--env-kwargs", metavar="JSON", help="merged over the checkpoint's data.env_kwargs")
    p.add_argument("--batch", type=int, default=4, help="multi-task env: episodes of a task in lockstep")
    p.add_argument("--metrics", choices=("driving", "basic"), help="default: driving on highway-env only")
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


def env_settings(ckpt: dict[str, Any], env_id: str | None, override: dict[str, Any]) -> tuple[str, dict]:
    """The checkpoint's ``(env_id, env_kwargs)`` with the command line's over them."""
    data = ckpt.get("datamodule_hyper_parameters") or {}
    env_id = env_id or data.get("env_id")
    if not env_id:
        raise ValueError("--env: the checkpoint records no env (no data.env_id); give one with --env ID")
    return env_id, {**(data.get("env_kwargs") or {}), **override}


def wants_driving(env_id: str, env_kwargs: dict[str, Any], choice: str | None) -> bool:
    """``--metrics`` where given, else whether the env is a highway-env scene; ``ValueError`` for
    ``--metrics driving`` on another env."""
    from fastlight.envs.registry import make_env
    from fastlight.metrics.driving import is_highway_env

    env = make_env(env_id, env_kwargs=env_kwargs, flag="--env")
    highway = is_highway_env(env)
    env.close()
    if choice == "driving" and not highway:
        raise ValueError(
            f"--metrics driving: {env_id} is not a highway-env scene, whose simulator the driving metrics "
            "read (highway-fast-v0, merge-v0, roundabout-v0, ...); leave --metrics out or give basic"
        )
    return highway and choice != "basic"


def write_gifs(directory: Path, episodes: list[EpisodeRecord], fps: float) -> list[str]:
    """``episode_<i>[_<task>]_seed<seed>.gif`` for every episode that kept frames."""
    import imageio.v3 as iio

    written = []
    for i, e in enumerate(episodes):
        if len(e.frames) < 1:
            continue
        directory.mkdir(parents=True, exist_ok=True)
        name = f"episode_{i:03d}" + (f"_{e.task}" if e.task else "") + f"_seed{e.seed}.gif"
        iio.imwrite(directory / name, np.stack(e.frames), extension=".gif", duration=1000.0 / fps, loop=0)
        written.append(str(directory / name))
    return written


def _row(index: int, e: EpisodeRecord, driving: DrivingEpisode | None) -> dict[str, Any]:
    """An episode as a JSON row (``return``, not the attribute's ``ret``; no frames; its driving sums)."""
    fields = ("seed", "length", "terminated", "truncated", "success", "crashed", "task")
    row = {"index": index, **{k: getattr(e, k) for k in fields}, "return": e.ret}
    return row if driving is None else {**row, "driving": asdict(driving)}


def _fmt_rate(r: dict[str, float] | None) -> str:
    return (
        "not reported by the env" if r is None else f"{r['rate']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
    )


def _driving_lines(driving: dict[str, dict[str, float] | None]) -> list[str]:
    """FAST §5's metrics, 4 significant digits."""
    from fastlight.metrics.driving import NOT_IN_HIGHWAY_ENV

    lines = ["  driving metrics (FAST §5), 95% CI: percentile bootstrap over episodes"]
    for key, m in driving.items():
        ci = (
            "n/a in this scene" if m is None else f"{m['value']:.4g}  [{m['ci_low']:.4g}, {m['ci_high']:.4g}]"
        )
        lines.append(f"    {key:<27} {ci}")
    return lines + [f"    {key:<27} n/a: {why}" for key, why in NOT_IN_HIGHWAY_ENV.items()]


def report(result: dict[str, Any]) -> str:
    s = result["summary"]
    r, driving = s["return"], s.get("driving")
    return "\n".join(
        [
            f"{PROG}: {result['ckpt']} ({result['module']}, policy_version {result['policy_version']}) "
            f"on {result['env_id']}, {s['episodes']} episodes from seed {result['seed']}, "
            f"{'sampled' if result['sample'] else 'greedy'} actions",
            f"  mean return     {r['mean']:.3f}  95% CI [{r['ci_low']:.3f}, {r['ci_high']:.3f}] (bootstrap)",
            f"  mean length     {s['length']['mean']:.1f} steps",
            f"  success rate    {_fmt_rate(s['success_rate'])}",
            f"  crash rate      {_fmt_rate(s['crash_rate'])}",
            *([] if driving is None else _driving_lines(driving)),
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run ``fastlight evaluate`` (``argv`` without the subcommand); returns what it writes."""
    args = parse(list(sys.argv[2:] if argv is None else argv))
    # Like `fastlight fit`: class paths of the project being run (examples.*, a user's package).
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    if args.video:
        from fastlight.extras import check_extra

        try:  # before the (long) evaluation
            check_extra("imageio", extra="bench", what=f"{PROG} --video")
        except ModuleNotFoundError as e:
            fail(str(e))
    import torch

    from fastlight.checkpoints import read_checkpoint
    from fastlight.data.env_spec import bind_instruction_table, env_spec_of
    from fastlight.envs.registry import check_env_id
    from fastlight.evaluation import per_task_summary, play_policy, probe_env, summarise
    from fastlight.metrics.driving import DrivingRecorder, driving_summary
    from fastlight.modules.loading import load_module_of

    try:
        ckpt = read_checkpoint(args.ckpt, flag="--ckpt")
        env_id, env_kwargs = env_settings(ckpt, args.env, args.env_override)
        # Before the (possibly large) model is built.
        flag = "--env" if args.env else f"the checkpoint's data.env_id (from {args.ckpt}; or give --env)"
        check_env_id(env_id, flag=flag)
        module = load_module_of(args.ckpt, ckpt)
        task_names, image_mode = probe_env(env_id, env_kwargs)
        # A VLA whose backbone has its own tokenizer re-tokenizes the env's instructions.
        wrappers = (ckpt.get("datamodule_hyper_parameters") or {}).get("env_wrappers") or []
        bind_instruction_table(module.policy, env_spec_of(env_id, env_kwargs, wrappers).instructions)
        recorder = DrivingRecorder() if wants_driving(env_id, env_kwargs, args.metrics) else None
    except (FileNotFoundError, ValueError) as e:
        fail(str(e).splitlines()[0])
    torch.manual_seed(args.seed)  # --sample: reproducible
    record, video_note = bool(args.video), None
    if task_names and args.video and not image_mode:
        record = False
        video_note = "--video: state mode has no camera frames; image mode is data.env_kwargs.image: true"
        print(f"{PROG}: {video_note}", file=sys.stderr)
    if record:
        # No window needed (not "dummy": highway-env then stops drawing, every frame the first one).
        os.environ.setdefault("SDL_VIDEODRIVER", "offscreen")
    episodes, _, render_fps = play_policy(
        module.policy, env_id, env_kwargs, episodes=args.episodes, seed=args.seed,
        deterministic=not args.sample, wrappers=wrappers, batch=args.batch, record=record,
        task_names=task_names,  # probed once, in main
        progress=progress_line(), observer=recorder,
    )  # fmt: skip
    videos = write_gifs(Path(args.video), episodes, args.fps or render_fps) if args.video else []
    version = ckpt["state_dict"].get("_policy_version")
    driving = [None] * len(episodes) if recorder is None else recorder.episodes
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
        "summary": summarise(episodes, seed=args.seed, n_boot=N_BOOT),
        "videos": videos,
        "video_note": video_note,
        "episodes": [_row(i, e, d) for i, (e, d) in enumerate(zip(episodes, driving, strict=True))],
    }
    if recorder is not None:
        result["summary"]["driving"] = driving_summary(recorder.episodes, n_boot=N_BOOT, seed=args.seed)
    if task_names:
        result["per_task"] = per_task_summary(episodes, task_names, n_boot=N_BOOT, seed=args.seed)
    text = json.dumps(result, indent=1) + "\n"
    if args.out:
        out = Path(args.out)
    else:  # each call its own file, the latest also under the stable <ckpt>.eval.json
        stem = str(Path(args.ckpt).with_suffix(""))
        out = Path(f"{stem}.eval-{time.strftime('%Y%m%d-%H%M%S')}-seed{args.seed}.json")
        Path(f"{stem}.eval.json").write_text(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(report(result))
    print(f"{PROG}: wrote {out}" + (f" and {len(videos)} GIFs under {args.video}" if videos else ""))
    return result
