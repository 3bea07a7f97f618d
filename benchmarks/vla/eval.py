"""Per-task Meta-World (MT10) success of VLA checkpoints and BC baselines, with honest statistics.

    python -m benchmarks.vla.eval \\
        --ckpt sft=runs/vla_metaworld_mt10_sft/tb/version_0/checkpoints/last.ckpt \\
        --ckpt rl=runs/vla_metaworld_mt10/tb/version_0/checkpoints/last.ckpt \\
        --mlp bc=runs/bc_mt10.pt --episodes-per-task 20

Every policy plays the *same* episodes: episode ``i`` of task ``k`` is reset with
:func:`fastlight.evaluation.eval_seed` ``(--seed, k, i)``, so any two policies face the same goals and
their differences are paired. Episodes run to their natural end (success or the env's time limit),
played by :func:`fastlight.evaluation.play_tasks`; an episode succeeded if any of its steps reported
success (:func:`fastlight.rollout.success_after`).

Statistics (all 95%):

- per task: the success rate with its Wilson score interval (:func:`fastlight.stats.wilson_interval`),
  which keeps a sensible width at 0/n and n/n where the normal approximation collapses to a point;
- the mean over tasks (the MT10 score): a stratified bootstrap
  (:func:`fastlight.stats.stratified_mean_ci`) that resamples episodes within each task, so every
  resample keeps the task mix fixed;
- B - A between two policies: a paired stratified bootstrap (:func:`benchmarks.stats.paired.paired_diff_ci`)
  that resamples the same episode indices for both policies, using the shared seeds to cancel goal
  difficulty.

The env settings come from the checkpoints (the datamodule's ``env_id`` / ``env_kwargs``) and from
the BC files; policies trained on different settings are refused unless ``--env-kwargs`` makes them
agree. Writes ``<--out>.md`` (tables) and ``<--out>.json`` (everything, with per-episode records).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.stats.paired import paired_diff_ci
from fastlight.evaluation import (
    BatchActFn,
    per_task_outcomes,
    per_task_summary,
    play_tasks,
    policy_batch_act_fn,
    probe_env,
)
from fastlight.rollout import EpisodeRecord

COMMAND = "python -m benchmarks.vla.eval"
DEFAULT_ENV_ID = "fastlight/MetaWorld-v0"


# ---------------------------------------------------------------------- policies
@dataclass
class Policy:
    """One evaluated policy: where it came from, how it acts, and the env it was trained on."""

    label: str
    path: str
    kind: str  # "VLA" (--ckpt) or "MLP" (--mlp)
    flag: str
    env_id: str | None
    env_kwargs: dict[str, Any] | None
    meta: dict[str, Any] = field(default_factory=dict)
    act: BatchActFn | None = None


_LABEL = re.compile(r"^[A-Za-z0-9_.+-]+$")
_GENERIC_STEMS = {"last", "model", "checkpoint", "best"}
_GENERIC_DIRS = {"checkpoints", "tb", "csv", "lightning_logs"}


def split_spec(spec: str) -> tuple[str | None, str]:
    """``"LABEL=PATH"`` -> ``(LABEL, PATH)``; ``"PATH"`` -> ``(None, PATH)``.

    A spec that is itself an existing file is a path even with an ``=`` in it (Lightning names
    checkpoints ``epoch=3-step=100.ckpt``).
    """
    if "=" in spec and not Path(spec).is_file():
        label, path = spec.split("=", 1)
        if _LABEL.match(label):
            return label, path
    return None, spec


def default_label(path: str) -> str:
    """A readable label for an unlabelled path: its stem, or its run's directory for ``last.ckpt``."""
    p = Path(path)
    if p.stem not in _GENERIC_STEMS and not p.stem.startswith("epoch="):
        return p.stem
    for part in reversed(p.parent.parts):
        if (
            part not in _GENERIC_DIRS
            and not re.fullmatch(r"version_\d+", part)
            and part not in ("", ".", "/")
        ):
            return part
    return p.stem


def _ckpt_policy(label: str, path: str) -> Policy:
    """Read the checkpoint's metadata and env settings (the weights are loaded later)."""
    from fastlight.checkpoints import read_checkpoint

    ckpt = read_checkpoint(path, flag="--ckpt")
    data = ckpt.get("datamodule_hyper_parameters") or {}
    version = ckpt["state_dict"].get("_policy_version")
    meta: dict[str, Any] = {
        "module": (ckpt.get("hyper_parameters") or {}).get("_class_path"),
        "datamodule": data.get("_class_path"),
        "global_step": ckpt.get("global_step"),
        "policy_version": int(version) if version is not None else None,
    }
    if "demos_per_task" in data:
        meta["demos_per_task"] = data["demos_per_task"]
        expert = _demo_expert_stats(data)
        if expert is not None:
            meta["expert"] = expert
    return Policy(label, path, "VLA", "--ckpt", data.get("env_id"), data.get("env_kwargs"), meta)


def _demo_expert_stats(data: dict[str, Any]) -> dict[str, Any] | None:
    """The scripted expert's per-task record from the demo cache's JSON sidecar, if it is still there."""
    try:
        from fastlight.vla.demos import DemoSettings, cache_path

        fields = (
            "env_id",
            "env_kwargs",
            "demos_per_task",
            "seed",
            "successful_only",
            "max_attempts_per_demo",
        )
        settings = DemoSettings(**{k: data[k] for k in fields})
        sidecar = cache_path(data.get("cache_dir", "runs/demo_cache"), settings).with_suffix(".json")
        return json.loads(sidecar.read_text()).get("expert") if sidecar.is_file() else None
    except (KeyError, TypeError, ValueError, OSError):  # an older or foreign datamodule: no stats
        return None


def _mlp_policy(label: str, path: str) -> Policy:
    if not Path(path).is_file():
        raise FileNotFoundError(f"--mlp: no BC baseline file at {path}")
    from benchmarks.vla.bc_baseline import load_bc  # imported only when --mlp is given

    try:
        act, meta = load_bc(path)
    except Exception as e:  # noqa: BLE001 - whatever went wrong, name the flag and the file
        raise ValueError(f"--mlp: {path} is not a readable BC baseline ({type(e).__name__}: {e})") from e
    info = {k: v for k, v in meta.items() if k not in ("env_id", "env_kwargs")}
    stats = meta.get("stats")
    expert = meta.get("expert") or (stats.get("expert") if isinstance(stats, dict) else None)
    if expert is not None:
        info["expert"] = expert
    if isinstance(stats, dict) and "steps" in stats:
        info.setdefault("global_step", stats["steps"])  # BC training steps, the MLP's global_step
    return Policy(label, path, "MLP", "--mlp", meta.get("env_id"), meta.get("env_kwargs"), info, act)


def resolve_env(policies: list[Policy], override: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """The one ``(env_id, env_kwargs)`` every policy is evaluated on.

    ``override`` is merged over each policy's recorded ``env_kwargs`` (its keys win). Raises
    ``ValueError`` naming two labels and the differing keys when the results still disagree.
    """
    settings = [
        (p, p.env_id or DEFAULT_ENV_ID, {**(p.env_kwargs or {}), **(override or {})})
        for p in policies
        if p.env_id is not None or p.env_kwargs is not None  # one that records nothing takes the others'
    ]
    if not settings:
        if override is None:
            raise ValueError(
                "no policy records its env settings (env_id / env_kwargs): give them with --env-kwargs"
            )
        return DEFAULT_ENV_ID, dict(override)
    first, env_id, kwargs = settings[0]
    unset = "<unset>"
    for p, other_id, other in settings[1:]:
        diffs = [("env_id", env_id, other_id)] if other_id != env_id else []
        diffs += [
            (k, kwargs.get(k, unset), other.get(k, unset))
            for k in sorted(set(kwargs) | set(other))
            if kwargs.get(k, unset) != other.get(k, unset)
        ]
        if diffs:
            shown = ", ".join(f"{k}: {x!r} vs {y!r}" for k, x, y in diffs)
            raise ValueError(
                f"{first.label} and {p.label} were trained on different env settings ({shown}); all "
                "policies must be evaluated on the same env: --env-kwargs JSON sets the differing env_kwargs"
            )
    return env_id, kwargs


# ---------------------------------------------------------------------- evaluation
def write_gifs(directory: Path, label: str, episodes: list[EpisodeRecord], fps: float = 20.0) -> list[str]:
    """One GIF ``<label>_<task>.gif`` per task, from the first recorded episode's frames."""
    from fastlight.extras import check_extra

    check_extra("imageio", extra="bench", what=f"{COMMAND} --video")
    import imageio.v3 as iio

    directory.mkdir(parents=True, exist_ok=True)
    written, seen = [], set()
    for e in episodes:
        if e.task in seen or not e.frames:
            continue
        seen.add(e.task)
        path = directory / f"{label}_{e.task}.gif"
        # Pillow's GIF writer takes the frame duration in milliseconds.
        iio.imwrite(path, np.stack(e.frames), extension=".gif", duration=1000.0 / fps, loop=0)
        written.append(str(path))
    return written


# ---------------------------------------------------------------------- report
def _fmt_rate(r: dict[str, float]) -> str:
    return f"{r['rate']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"


def _fmt_expert(expert: dict[str, Any] | None) -> str:
    if not isinstance(expert, dict) or not expert:
        return "-"
    try:
        ok = sum(int(v["successes"]) for v in expert.values())
        tried = sum(int(v["attempts"]) for v in expert.values())
    except (KeyError, TypeError, ValueError, AttributeError):
        return "recorded (see JSON)"
    return f"{ok}/{tried} ({ok / max(tried, 1):.0%})"


def _jsonable(value: Any) -> Any:
    """JSON fallback for metadata values (numpy / torch arrays and scalars from a BC file)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def render_markdown(result: dict[str, Any]) -> str:
    """The ``.md`` report of a :func:`main` result."""
    labels = [p["label"] for p in result["policies"]]
    tasks = result["task_names"]
    stats = result["summary"]
    mean_name = "MT10 mean" if len(tasks) == 10 else f"mean over {len(tasks)} tasks"
    head = "| task | " + " | ".join(labels) + " |"
    sep = "|---|" + "---|" * len(labels)
    rows = [
        f"| {t} | " + " | ".join(_fmt_rate(stats[lb]["per_task"][t]) for lb in labels) + " |" for t in tasks
    ]
    rows.append(
        f"| **{mean_name}** | " + " | ".join(f"**{_fmt_rate(stats[lb]['mean'])}**" for lb in labels) + " |"
    )
    rows.append(
        "| mean episode length | " + " | ".join(f"{stats[lb]['mean_length']:.1f}" for lb in labels) + " |"
    )

    meta_rows = []
    for p in result["policies"]:
        m = p["meta"]
        meta_rows.append(
            f"| {p['label']} | {p['kind']} | `{p['path']}` | {_cell(m.get('global_step'))} | "
            f"{_cell(m.get('policy_version'))} | {_cell(m.get('demos_per_task'))} | "
            f"{_fmt_expert(m.get('expert'))} |"
        )

    diff_rows = [
        f"| {d['b']} - {d['a']} | {d['diff']:+.3f} | [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] | "
        f"{'yes' if d['excludes_zero'] else 'no'} |"
        for d in result["diffs"]
    ]
    env = result["env"]
    s = result["settings"]
    lines = [
        f"# {result['title']}",
        "",
        "```bash",
        result["command"],
        "```",
        "",
        f"Env `{env['env_id']}` with `{json.dumps(env['env_kwargs'], sort_keys=True)}`; "
        f"{s['episodes_per_task']} episodes per task, evaluation seed {s['seed']} (every policy plays the "
        f"same episodes), {_acting(s)} VLA actions, "
        f"episodes played to success or the time limit.",
        "",
        f"Success rate per task with the Wilson 95% interval; the {mean_name} with a stratified bootstrap "
        f"95% interval ({s['n_boot']} resamples of episodes within each task).",
        "",
        head,
        sep,
        *rows,
        "",
    ]
    if any(stats[lb]["mean"]["ci_low"] == stats[lb]["mean"]["ci_high"] for lb in labels):
        lines += [
            "A bootstrap interval of zero width means every episode of every task had the same outcome "
            "(resampling cannot vary it); the per-task Wilson intervals show the real uncertainty.",
            "",
        ]
    lines += [
        "## Policies",
        "",
        "| label | kind | path | global_step | policy_version | demos/task | expert success |",
        "|---|---|---|---|---|---|---|",
        *meta_rows,
        "",
    ]
    if diff_rows:
        lines += [
            "## Differences",
            "",
            f"B - A of the {mean_name}, paired bootstrap 95% interval (the same episode indices resampled "
            "for both policies, which played the same seeds).",
            "",
            "| B - A | difference | 95% CI | excludes 0 |",
            "|---|---|---|---|",
            *diff_rows,
            "",
        ]
    if result.get("video_note"):
        lines += [result["video_note"], ""]
    if result.get("notes"):
        lines += ["## Notes", "", result["notes"].rstrip("\n"), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------- CLI
def _acting(settings: dict[str, Any]) -> str:
    if not settings["sample"]:
        return "greedy (argmax)"
    t = settings.get("temperature")
    return "sampled" + (" (each checkpoint's temperature)" if t is None else f" at temperature {t:g}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--ckpt",
        action="append",
        default=[],
        metavar="[LABEL=]PATH",
        help="Lightning checkpoint of a fastlight VLA module (repeatable)",
    )
    p.add_argument(
        "--mlp",
        action="append",
        default=[],
        metavar="[LABEL=]PATH",
        help="BC baseline file of benchmarks.vla.bc_baseline (repeatable)",
    )
    p.add_argument("--episodes-per-task", type=int, default=20)
    p.add_argument("--seed", type=int, default=12_345, help="evaluation seed, shared by every policy")
    p.add_argument("--batch", type=int, default=4, help="episodes of one task played in lockstep")
    p.add_argument("--sample", action="store_true", help="sample VLA actions instead of taking the argmax")
    p.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="with --sample: every token VLA samples at T (default: each checkpoint's own temperature, "
        "which differs between an SFT and an RL config)",
    )
    p.add_argument("--video", metavar="DIR", help="image mode: a GIF of each task's first episode per policy")
    p.add_argument("--out", default="benchmarks/results/vla_mt10", help="writes <out>.md and <out>.json")
    p.add_argument("--title", default="Meta-World MT10: per-task success")
    p.add_argument("--notes", metavar="FILE", help="markdown appended to the report verbatim")
    p.add_argument(
        "--diff",
        action="append",
        default=[],
        metavar="A:B",
        help="report B - A (labels; repeatable; default: every policy against the first)",
    )
    p.add_argument("--env-kwargs", metavar="JSON", help="env_kwargs merged over the recorded ones")
    p.add_argument("--n-boot", type=int, default=10_000, help="bootstrap resamples")
    return p


def _parse(p: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, list[tuple]]:
    """Parse and check everything that needs no file read; returns args and ``(label, path, flag)``."""
    args = p.parse_args(argv)
    if args.episodes_per_task < 1:
        p.error(f"--episodes-per-task must be >= 1, got {args.episodes_per_task}")
    if args.temperature is not None and not (args.sample and args.temperature > 0):
        p.error(f"--temperature needs --sample and a value > 0, got {args.temperature}")
    if args.batch < 1:
        p.error(f"--batch must be >= 1, got {args.batch}")
    if args.n_boot < 1:
        p.error(f"--n-boot must be >= 1, got {args.n_boot}")
    specs = []
    for flag, values in (("--ckpt", args.ckpt), ("--mlp", args.mlp)):
        for spec in values:
            label, path = split_spec(spec)
            specs.append((label or default_label(path), path, flag))
    if not specs:
        p.error("give at least one --ckpt or --mlp")
    seen: dict[str, str] = {}
    for label, path, flag in specs:
        if label in seen:
            p.error(f"{flag}: duplicate label {label!r} (also {seen[label]}); name them with LABEL=PATH")
        seen[label] = f"{flag} {path}"
    labels = [s[0] for s in specs]
    pairs = []
    for d in args.diff:
        a, sep, b = d.partition(":")
        if not sep or not a or not b:
            p.error(f"--diff: expected A:B (two labels), got {d!r}")
        for x in (a, b):
            if x not in labels:
                p.error(f"--diff: unknown label {x!r} in {d!r}; labels: {', '.join(labels)}")
        pairs.append((a, b))
    args.diff_pairs = pairs or [(labels[0], b) for b in labels[1:]]
    args.env_override = None
    if args.env_kwargs is not None:
        try:
            args.env_override = json.loads(args.env_kwargs)
        except json.JSONDecodeError as e:
            p.error(f"--env-kwargs: not valid JSON ({e})")
        if not isinstance(args.env_override, dict):
            p.error(f"--env-kwargs: expected a JSON object, got {args.env_kwargs!r}")
    args.notes_text = None
    if args.notes is not None:
        try:
            args.notes_text = Path(args.notes).read_text()
        except OSError as e:
            p.error(f"--notes: cannot read {args.notes} ({e.strerror or e})")
    return args, specs


def main(argv: list[str] | None = None) -> dict:
    """Evaluate every ``--ckpt`` / ``--mlp`` policy, write ``<out>.md`` and ``.json``, return the result."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = build_parser()
    args, specs = _parse(p, argv)

    policies = []
    for label, path, flag in specs:
        try:
            policies.append(_ckpt_policy(label, path) if flag == "--ckpt" else _mlp_policy(label, path))
        except (FileNotFoundError, ValueError) as e:
            p.error(str(e))  # read_checkpoint / _mlp_policy already name the flag and the file
    try:
        env_id, env_kwargs = resolve_env(policies, args.env_override)
    except ValueError as e:
        p.error(str(e))
    task_names, image_mode = probe_env(env_id, env_kwargs)
    if not task_names:
        p.error(f"{env_id} is not a multi-task env (no task_names); this evaluates fastlight's Meta-World")
    for pol in policies:
        recorded = pol.meta.get("task_names")
        if recorded is not None and tuple(recorded) != task_names:
            p.error(
                f"{pol.flag}: {pol.label} was trained on tasks {list(recorded)}, "
                f"the env has {list(task_names)}"
            )

    video_note = None
    record = 0
    if args.video:
        if image_mode:
            from fastlight.extras import check_extra

            # Fail before the (long) evaluation.
            check_extra("imageio", extra="bench", what=f"{COMMAND} --video")
            record = 1
        else:
            video_note = (
                "--video: state mode has no camera frames to record; image mode is needed "
                "(data.env_kwargs.image: true)."
            )
            print(video_note, file=sys.stderr)

    import torch

    episodes: dict[str, list[EpisodeRecord]] = {}
    videos: dict[str, list[str]] = {}
    timings: dict[str, float] = {}
    for pol in policies:
        chunk = None
        if pol.act is None:
            from fastlight.data.env_spec import bind_instruction_table, env_spec_of
            from fastlight.models.action_mapping import action_chunk
            from fastlight.modules.loading import load_module

            module = load_module(pol.path, flag=pol.flag)
            # A backbone with its own tokenizer re-tokenizes the env's instructions, as in training.
            bind_instruction_table(module.policy, env_spec_of(env_id, env_kwargs).instructions)
            chunk = action_chunk(module.policy.action_mapping())  # chunks play open-loop
            if args.temperature is not None:
                from fastlight.vla.policy import VLAPolicy

                if not isinstance(module.policy, VLAPolicy):
                    p.error(f"--temperature: {pol.label} is not a token VLA (VLAPolicy); drop the flag")
                module.policy.temperature = args.temperature
            pol.act = policy_batch_act_fn(module.policy, deterministic=not args.sample)
        # Same torch seed per policy: sampled runs are reproducible and not order-dependent.
        torch.manual_seed(args.seed)
        t0 = time.perf_counter()
        eps = play_tasks(
            pol.act,
            env_id=env_id,
            env_kwargs=env_kwargs,
            episodes_per_task=args.episodes_per_task,
            seed=args.seed,
            batch=args.batch,
            action_chunk=chunk,
            record=record,
        )
        timings[pol.label] = time.perf_counter() - t0
        if record:
            videos[pol.label] = write_gifs(Path(args.video), pol.label, eps)
        for e in eps:
            e.frames = []  # frames are in the GIFs; do not hold them for every policy
        episodes[pol.label] = eps
        print(f"{COMMAND}: {pol.label} done in {timings[pol.label]:.0f} s", file=sys.stderr)

    # The pairing rests on every policy having played the same (task, seed) sequence.
    ref_label = policies[0].label
    ref = [(e.task, e.seed) for e in episodes[ref_label]]
    for label, eps in episodes.items():
        if [(e.task, e.seed) for e in eps] != ref:
            raise RuntimeError(
                f"{label} and {ref_label} did not play the same episodes; the diffs would not be paired"
            )

    summary = {
        lb: per_task_summary(eps, task_names, n_boot=args.n_boot, seed=args.seed)
        for lb, eps in episodes.items()
    }
    diffs = []
    for a, b in args.diff_pairs:
        d, low, high = paired_diff_ci(
            per_task_outcomes(episodes[a], task_names),
            per_task_outcomes(episodes[b], task_names),
            n_boot=args.n_boot,
            seed=args.seed,
        )
        diffs.append(
            {
                "a": a,
                "b": b,
                "diff": d,
                "ci_low": low,
                "ci_high": high,
                "excludes_zero": bool(low > 0 or high < 0),
            }
        )

    result: dict[str, Any] = {
        "title": args.title,
        "command": f"{COMMAND} {shlex.join(argv)}",
        "settings": {
            "episodes_per_task": args.episodes_per_task,
            "seed": args.seed,
            "batch": args.batch,
            "sample": args.sample,
            "temperature": args.temperature,
            "n_boot": args.n_boot,
            "confidence": 0.95,
        },
        "env": {"env_id": env_id, "env_kwargs": env_kwargs, "image": image_mode},
        "task_names": list(task_names),
        "policies": [
            {
                "label": pol.label,
                "path": pol.path,
                "kind": pol.kind,
                "flag": pol.flag,
                "recorded_env": {"env_id": pol.env_id, "env_kwargs": pol.env_kwargs},
                "meta": pol.meta,
                "eval_seconds": timings[pol.label],
                "videos": videos.get(pol.label, []),
            }
            for pol in policies
        ],
        "summary": summary,
        "diffs": diffs,
        "video_note": video_note,
        "notes": args.notes_text,
        "episodes": [
            {
                "policy": label,
                "task": e.task,
                "task_id": e.task_id,
                "seed": e.seed,
                "success": e.success,
                "length": e.length,
                "return": e.ret,
            }
            for label, eps in episodes.items()
            for e in eps
        ],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    md, js = out.with_name(out.name + ".md"), out.with_name(out.name + ".json")
    md.write_text(render_markdown(result))
    js.write_text(json.dumps(result, indent=1, default=_jsonable) + "\n")
    print(f"{COMMAND}: wrote {md} and {js}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
