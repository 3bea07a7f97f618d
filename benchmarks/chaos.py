"""Goodput under a kill loop: ``python -m benchmarks.chaos`` (from the repository root).

    python -m benchmarks.chaos --config configs/highway_dpsa.yaml --minutes 10 --mtbf 30 \\
        --targets sampler,inference [--seed S] [--schedule exponential|fixed] [--out benchmarks/results/chaos]

Runs ``fastlight fit`` twice on the same config for the same wall clock (``--trainer.max_time``), one
after the other: a baseline without faults, then a chaos run during which, from its first logged
update on, a seeded RNG picks a target kind (from ``--targets``) and one live process of that kind
and SIGKILLs it, every MTBF seconds: the gaps are exponential with mean ``--mtbf`` (a Poisson
process, torchft's punisher's and Ray's ``setup_chaos`` habit; ``--schedule fixed`` kills every
``--mtbf`` seconds exactly). The chaos run gets a restart budget no schedule can spend
(``--data.faults.max_worker_restarts``, ``--budget``), so each kill is a restart; both runs get the
same settings otherwise (with ``inference`` among the targets, both run a CPU inference worker,
``--data.inference '{}'``, and then any kill restarts the worker with its samplers, as fastlight does).

Processes are found through ``/proc``, below the run's own trainer only: the trainer's forkserver
(``python -m fastlight`` warms one; its children are the samplers and the inference worker) or its
``spawn_main`` children. The inference worker is the group's last-started process (the pool starts it
after its samplers, and restarts them together); a kill waits for the whole group to be up. Each
kill is checked against the restart line the run prints, which names the pid that died.

Reported: valid env steps/s (``perf/valid_steps_total`` of the last metrics row over the seconds from
the trainer's start to its exit, and over the training window, first to last metrics row) for both
runs and their ratio (the goodput), kills per kind, per kill the seconds to the run's restart line and
to the next metrics row after it (recovery), restarts / rollouts dropped / skipped updates (the
``faults/*`` columns), updates lost at the exit (trained, not in ``last.ckpt``), the exit codes, and
a resume of the chaos run's ``last.ckpt`` (``--ckpt_path``, 2 more updates: exit 0, global step
continued). Writes ``<out>.json`` and ``<out>.md``.

Not covered: trainer ranks (a lost rank stops a DDP / FSDP2 run with a checkpoint by design, there is
no elastic restart to measure goodput through: ``benchmarks.faults`` and ``tests/faults`` measure the
stop), Ray actors and nodes (they need a multi-node Ray cluster, ``make test-multinode``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks import REPO_ROOT, child_env
from benchmarks.procfs import descendants, start_ticks
from fastlight.procs import parent_pid
from fastlight.safe_files import safe_load

#: Target kinds this driver can kill; the others are named with the reason they are not covered.
KINDS = ("sampler", "inference")
NOT_COVERED = {
    "rank": "a lost trainer rank stops the run with a checkpoint by design (no elastic restart): "
    "benchmarks.faults and tests/faults measure that stop",
    "ray": "Ray actors and nodes need a multi-node Ray cluster (make test-multinode), not started here",
    "node": "Ray actors and nodes need a multi-node Ray cluster (make test-multinode), not started here",
}

#: The run's restart line: ``fastlight: sampler 0 (fastlight-sampler-0, pid 123, env ...) died ...;
#: restarting ...`` or ``fastlight: inference worker (fastlight-inference, pid 123, env ...) ...``.
#: The lines that say how a run ended: fastlight's own, or Lightning's stop at ``max_time`` / ``max_steps``.
END = re.compile(r"^(fastlight: |Time limit reached|`Trainer.fit` stopped)")
RESTART = re.compile(r"^fastlight: (sampler \d+|inference worker) \([^,]*, pid (\d+),.*; restarting", re.M)


@dataclass
class Kill:
    kind: str  # what the driver meant to kill
    pid: int
    t: float  # seconds since the trainer started
    named: str | None = None  # what the restart line says died ("sampler 0", "inference worker")
    named_pid: int | None = None
    restart_s: float | None = None  # kill -> the restart line
    recovery_s: float | None = None  # kill -> the first metrics row after the restart line
    lines_before: int = 0  # restart lines in the log before this kill
    rows_at_restart: int | None = None


@dataclass
class Run:
    name: str
    rc: int | None = None
    wall_s: float = 0.0  # the trainer's start -> its exit
    row_times: list[float] = field(default_factory=list)  # when each metrics row was first seen
    kills: list[Kill] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # scheduled kills that found no process
    last_line: str = ""


def schedule(seed: int, mtbf: float, seconds: float, targets: list[str], kind: str = "exponential"):
    """``(offset in seconds, target kind)`` of every kill in ``seconds``: gaps exponential with mean
    ``mtbf`` (``kind`` "exponential") or ``mtbf`` each ("fixed"); each kill's kind drawn uniformly
    from ``targets``. The same seed gives the same schedule."""
    if mtbf <= 0:
        raise ValueError(f"--mtbf must be > 0, got {mtbf}")
    if kind not in ("exponential", "fixed"):
        raise ValueError(f"--schedule must be exponential or fixed, got {kind!r}")
    rng = random.Random(seed)
    out: list[tuple[float, str]] = []
    t = 0.0
    while True:
        t += rng.expovariate(1.0 / mtbf) if kind == "exponential" else mtbf
        if t >= seconds:
            return out
        out.append((t, rng.choice(targets)))


def workers(trainer: int) -> list[int]:
    """The run's samplers and inference worker, below ``trainer`` only, oldest first: the children of
    the trainer's forkserver (``python -m fastlight``) or its ``spawn_main`` children, not the
    forkserver itself or multiprocessing's resource tracker."""
    found = []
    below = descendants(trainer)
    forkservers = set()
    cmdlines = {}
    for pid in below:
        try:
            cmdlines[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing.forkserver" in cmdlines[pid] and parent_pid(pid) == trainer:
            forkservers.add(pid)
    for pid, cmd in cmdlines.items():
        if pid in forkservers or b"resource_tracker" in cmd:
            continue
        if parent_pid(pid) in forkservers or b"spawn_main" in cmd:
            found.append(pid)
    keyed = []
    for pid in found:
        try:
            keyed.append((start_ticks(pid), pid))
        except ProcessLookupError:
            pass
    return [pid for _, pid in sorted(keyed)]


def by_kind(pids: list[int], inference: bool) -> dict[str, list[int]]:
    """``workers``' list by kind: with an inference worker it is the last started (after its samplers)."""
    if inference and pids:
        return {"sampler": pids[:-1], "inference": pids[-1:]}
    return {"sampler": list(pids), "inference": []}


def read_rows(metrics: Path) -> list[dict[str, str]]:
    if not metrics.is_file():
        return []
    with open(metrics) as f:
        return list(csv.DictReader(f))


def last_value(rows: list[dict[str, str]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key)]
    return values[-1] if values else None


def summarize(run: Run, rows: list[dict[str, str]]) -> dict:
    """One run's figures from its metrics.csv rows and the driver's clock (``Run``)."""
    valid = last_value(rows, "perf/valid_steps_total") or 0.0
    first_valid = next(
        (float(r["perf/valid_steps_total"]) for r in rows if r.get("perf/valid_steps_total")), 0.0
    )
    window = run.row_times[-1] - run.row_times[0] if len(run.row_times) >= 2 else 0.0
    steps = [int(r["step"]) for r in rows if r.get("step")]
    kills = {k: sum(x.kind == k for x in run.kills) for k in KINDS}
    recov = [k.recovery_s for k in run.kills if k.recovery_s is not None]
    return {
        "name": run.name,
        "rc": run.rc,
        "wall_s": run.wall_s,
        "valid_steps": valid,
        "updates": max(steps) + 1 if steps else 0,
        "steps_per_s": valid / run.wall_s if run.wall_s > 0 else 0.0,
        "window_s": window,
        "window_steps_per_s": (valid - first_valid) / window if window > 0 else 0.0,
        "kills": kills,
        "kills_named_as_meant": sum(_named_as_meant(k) for k in run.kills),
        "unrecovered": sum(k.recovery_s is None for k in run.kills),
        "recovery_s": {
            "mean": sum(recov) / len(recov) if recov else None,
            "max": max(recov) if recov else None,
        },
        "restarts": last_value(rows, "faults/worker_restarts"),
        "dropped_rollouts": last_value(rows, "faults/dropped_rollouts"),
        "skipped_updates": last_value(rows, "faults/skipped_updates"),
    }


def _named_as_meant(k: Kill) -> bool:
    return k.named_pid == k.pid and (k.named or "").startswith(
        "sampler" if k.kind == "sampler" else "inference"
    )


def goodput(base: dict, chaos: dict) -> dict[str, float | None]:
    """Chaos over baseline valid env steps/s, over the whole run and over the training window."""
    return {
        "overall": chaos["steps_per_s"] / base["steps_per_s"] if base["steps_per_s"] else None,
        "window": chaos["window_steps_per_s"] / base["window_steps_per_s"]
        if base["window_steps_per_s"]
        else None,
    }


def fit_command(config: Path, root: Path, seconds: int, extra: list[str]) -> list[str]:
    limit = f"00:{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    return [
        sys.executable, "-m", "fastlight", "fit", "--config", str(config),
        "--trainer.max_time", limit, "--trainer.max_steps", "-1", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(root), *extra,
    ]  # fmt: skip


def execute(name: str, cmd: list[str], root: Path, plan: list[tuple[float, str]], seed: int,
            inference: bool) -> Run:  # fmt: skip
    """Run ``cmd`` to its end; from its first metrics row on, kill as ``plan`` says."""
    log = root.parent / f"{root.name}.log"
    metrics = root / "csv" / "version_0" / "metrics.csv"
    run = Run(name)
    rng = random.Random(seed + 1)  # which process of the kind
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True
        )
    t0 = time.monotonic()
    todo = list(plan)
    t_first: float | None = None
    group = 0  # processes in a whole group (seen at the first row)
    pending: list[Kill] = []
    try:
        while proc.poll() is None:
            now = time.monotonic() - t0
            rows = len(read_rows(metrics))
            while len(run.row_times) < rows:
                run.row_times.append(now)
            if t_first is None and rows:
                t_first, group = now, len(workers(proc.pid))
            text = log.read_text(errors="replace")
            lines = RESTART.findall(text)
            for k in pending:
                if k.restart_s is None and len(lines) > k.lines_before:
                    k.named, k.named_pid = lines[k.lines_before][0], int(lines[k.lines_before][1])
                    k.restart_s, k.rows_at_restart = now - k.t, rows
                elif k.restart_s is not None and k.recovery_s is None and rows > (k.rows_at_restart or 0):
                    k.recovery_s = now - k.t
            pending = [k for k in pending if k.recovery_s is None]
            if t_first is not None and todo and now - t_first >= todo[0][0]:
                kinds = by_kind(workers(proc.pid), inference)
                pids = kinds[todo[0][1]]
                if sum(map(len, kinds.values())) < group or not pids:  # a restart under way: wait for it
                    if now - t_first - todo[0][0] > 60:
                        run.skipped.append(
                            {"t": now, "kind": todo.pop(0)[1], "why": "no whole group for 60 s"}
                        )
                else:
                    kind = todo.pop(0)[1]
                    pid = rng.choice(pids)
                    kill = Kill(kind, pid, now, lines_before=len(lines))
                    try:
                        os.kill(pid, signal.SIGKILL)
                        run.kills.append(kill)
                        pending.append(kill)
                    except ProcessLookupError:
                        run.skipped.append({"t": now, "kind": kind, "why": f"pid {pid} gone"})
            time.sleep(0.25)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=300)
    run.rc = proc.returncode
    run.wall_s = time.monotonic() - t0
    rows = len(read_rows(metrics))
    while len(run.row_times) < rows:
        run.row_times.append(run.wall_s)
    text = log.read_text(errors="replace")
    run.last_line = end_line(text)
    return run


def end_line(text: str) -> str:
    """The last line of a run's output that says how it ended (else its last line)."""
    ends = [line.strip() for line in text.splitlines() if END.match(line)]
    return ends[-1] if ends else (text.strip().splitlines() or [""])[-1][:200]


def ckpt_state(path: Path) -> tuple[int, int] | None:
    """(global step, policy version) of a checkpoint file, None if absent."""
    if not path.is_file():
        return None
    ck = safe_load(path, flag="--ckpt_path")
    return int(ck["global_step"]), int(ck["state_dict"]["_policy_version"])


def resume(config: Path, root: Path, extra: list[str], updates: int = 2) -> dict:
    """``fit --ckpt_path last`` in the chaos run's ``root`` for ``updates`` more updates: the exit code,
    and the global step / policy version of ``last.ckpt`` before and of the newest checkpoint after."""
    before = ckpt_state(root / "checkpoints" / "last.ckpt")
    if before is None:
        return {"rc": None, "line": f"no checkpoint at {root / 'checkpoints' / 'last.ckpt'}"}
    steps_per_update = before[0] // max(before[1], 1)
    cmd = fit_command(config, root, 3600, [*extra, "--ckpt_path", "last"])
    cmd[cmd.index("--trainer.max_steps") + 1] = str(before[0] + updates * steps_per_update)
    log = root.parent / f"{root.name}_resume.log"
    t = time.time()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(), timeout=900).returncode
    written = [p for p in (root / "checkpoints").rglob("*.ckpt") if p.stat().st_mtime >= t]
    after = ckpt_state(max(written, key=lambda p: p.stat().st_mtime)) if written else None
    return {
        "rc": rc,
        "global_step_before": before[0],
        "policy_version_before": before[1],
        "global_step_after": None if after is None else after[0],
        "policy_version_after": None if after is None else after[1],
        "continued": after is not None and after[0] > before[0] and after[1] > before[1],
        "line": end_line(log.read_text(errors="replace")),
    }


def updates_lost(root: Path, rows: list[dict[str, str]]) -> int | None:
    """Updates trained (metrics rows' steps) but not in ``last.ckpt`` at the exit."""
    saved = ckpt_state(root / "checkpoints" / "last.ckpt")
    steps = [int(r["step"]) for r in rows if r.get("step")]
    return None if saved is None else max(0, (max(steps) + 1 if steps else 0) - saved[1])


def _f(x, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def _code(text: str) -> str:
    """``text`` as Markdown code, also when it holds a backtick."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def markdown(result: dict) -> str:
    b, c, g, r = result["baseline"], result["chaos"], result["goodput"], result["resume"]
    out = [
        f"`{result['command']}`",
        "",
        f"Schedule: {result['schedule']} gaps, mean {result['mtbf']} s, seed {result['seed']}, "
        f"targets {', '.join(result['targets'])}; {result['seconds']} s per run (`--trainer.max_time`).",
        "",
        "| run | exit | wall s | updates | valid env steps | valid steps/s (wall) "
        "| valid steps/s (training window) | kills (sampler / inference) | restarts | rollouts dropped "
        "| skipped updates | updates lost at exit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in (b, c):
        out.append(
            f"| {s['name']} | {s['rc']} | {s['wall_s']:.0f} | {s['updates']} | {s['valid_steps']:.0f} "
            f"| {s['steps_per_s']:.1f} | {s['window_steps_per_s']:.1f} | {s['kills']['sampler']} / "
            f"{s['kills']['inference']} | {_f(s['restarts'], '.0f')} | {_f(s['dropped_rollouts'], '.0f')} "
            f"| {_f(s['skipped_updates'], '.0f')} | {_f(s['updates_lost'], 'd')} |"
        )
    out += [
        "",
        f"Goodput (chaos / baseline valid env steps/s): {_f(g['overall'], '.2f')} over the wall clock, "
        f"{_f(g['window'], '.2f')} over the training window. Recovery (kill -> the first metrics row after "
        f"the run's restart line): mean {_f(c['recovery_s']['mean'])} s, max {_f(c['recovery_s']['max'])} s; "
        f"{c['unrecovered']} kills without a recovery before the run ended; {c['kills_named_as_meant']} of "
        f"{len(result['kills'])} restart lines name the process killed. {len(result['kills'])} of the "
        f"{len(result['planned_kills'])} kills planned in {result['seconds']} s were made (the schedule "
        "counts from the chaos run's first metrics row; later ones fell after its end); "
        f"{len(c['skipped_kills'])} found no process to kill.",
        "",
        "| kill | at s | kind | pid | restart line names | s to restart line | s to next metrics row |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, k in enumerate(result["kills"], 1):
        named = "-" if k["named"] is None else f"{k['named']} (pid {k['named_pid']})"
        out.append(
            f"| {i} | {k['t']:.1f} | {k['kind']} | {k['pid']} | {named} | {_f(k['restart_s'])} "
            f"| {_f(k['recovery_s'])} |"
        )
    out += [
        "",
        f"Resume of the chaos run (`--ckpt_path last`, 2 more updates): exit {r.get('rc')}, "
        f"global step {r.get('global_step_before')} -> {r.get('global_step_after')}, policy version "
        f"{r.get('policy_version_before')} -> {r.get('policy_version_after')}: {_code(r.get('line', ''))}",
        "",
        f"Baseline's last line: {_code(b['last_line'])}; chaos run's: {_code(c['last_line'])}",
    ]
    if result["not_covered"]:
        out += ["", "Not covered: " + "; ".join(f"{k}: {v}" for k, v in result["not_covered"].items())]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "highway_dpsa.yaml")
    ap.add_argument("--minutes", type=float, default=10.0, help="wall clock of each run")
    ap.add_argument("--mtbf", type=float, default=30.0, help="mean seconds between kills")
    ap.add_argument("--schedule", choices=("exponential", "fixed"), default="exponential")
    ap.add_argument("--targets", default="sampler,inference", help=f"comma-separated, of {', '.join(KINDS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--budget", type=int, default=10000, help="the chaos run's --data.faults.max_worker_restarts"
    )
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "chaos")
    ap.add_argument("--workdir", type=Path, default=None, help="run roots (default: a new temp folder)")
    ap.add_argument(
        "fit_args", nargs=argparse.REMAINDER, help="after --: more fastlight fit flags, both runs"
    )
    args = ap.parse_args()
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    not_covered = {t: NOT_COVERED[t] for t in targets if t in NOT_COVERED}
    targets = [t for t in targets if t in KINDS]
    unknown = [
        t
        for t in args.targets.split(",")
        if t.strip() and t.strip() not in KINDS and t.strip() not in NOT_COVERED
    ]
    if unknown or not targets:
        ap.error(f"--targets: {', '.join(unknown) or 'none'}: choose from {', '.join(KINDS)}")
    for t, why in not_covered.items():
        print(f"chaos: --targets {t} is not covered: {why}", file=sys.stderr)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="fastlight-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    seconds = int(args.minutes * 60)
    inference = "inference" in targets
    extra = [a for a in args.fit_args if a != "--"] + (["--data.inference", "{}"] if inference else [])
    budget = ["--data.faults.max_worker_restarts", str(args.budget)]
    plan = schedule(args.seed, args.mtbf, seconds, targets, args.schedule)
    runs, summaries = {}, {}
    for name, kills, more in (("baseline", [], []), ("chaos", plan, budget)):
        root = work / name
        cmd = fit_command(args.config, root, seconds, [*extra, *more])
        print(f"chaos: {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        runs[name] = execute(name, cmd, root, kills, args.seed, inference)
        rows = read_rows(root / "csv" / "version_0" / "metrics.csv")
        summaries[name] = summarize(runs[name], rows) | {
            "updates_lost": updates_lost(root, rows),
            "last_line": runs[name].last_line,
            "skipped_kills": runs[name].skipped,
        }
    resumed = resume(args.config, work / "chaos", [*extra, *budget])
    shown = " ".join(a if " " not in a and a != "{}" else f"'{a}'" for a in sys.argv[1:])
    result = {
        "command": f"python -m benchmarks.chaos {shown}",
        "config": str(args.config),
        "seconds": seconds,
        "mtbf": args.mtbf,
        "schedule": args.schedule,
        "seed": args.seed,
        "targets": targets,
        "planned_kills": plan,
        "baseline": summaries["baseline"],
        "chaos": summaries["chaos"],
        "goodput": goodput(summaries["baseline"], summaries["chaos"]),
        "kills": [asdict(k) for k in runs["chaos"].kills],
        "resume": resumed,
        "not_covered": not_covered,
        "workdir": str(work),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result)
    Path(f"{args.out}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
