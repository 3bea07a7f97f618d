"""Fault-injection probe: ``python -m benchmarks.faults`` (from the repository root).

Runs ``fastlight fit`` on ``configs/highway_dpsa.yaml`` shrunk to the fault-injecting test env
(``tests.fake_envs:Fault-v0``, 2 samplers, 8-step cycles, one update = 2 optimizer steps) and
injects one fault per run: a signal once updates are being logged (to the trainer, or SIGKILL /
SIGSTOP to one sampler process), a NaN reward or observation from the env, an env hanging in
``step``, a huge reward that makes the loss non-finite, an impossible setting, a resume past
``max_steps``. Each row reports the exit code, the fastlight line, seconds from the injection to
the exit (or, for a sampler fault that is recovered, to the restart and to the next logged update),
updates lost (trained by the process but not in the checkpoint), rollouts dropped by restarts and
child processes left alive. Markdown to stdout.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.procfs import descendants, spawned_descendants, start_ticks
from fastlight.procs import alive, parent_pid
from fastlight.safe_files import safe_load

ROOT = Path.cwd()


def command(root: Path, *extra: str, env_kwargs: str = '{"step_sleep": 0.02}') -> list[str]:
    return [
        sys.executable, "-m", "fastlight.cli", "fit", "--config", str(ROOT / "configs" / "highway_dpsa.yaml"),
        "--data.env_id", "tests.fake_envs:Fault-v0", "--data.env_kwargs", env_kwargs,
        "--data.num_envs", "2", "--data.num_workers", "2", "--data.max_horizon", "8",
        "--data.steps_per_epoch", "1000", "--model.update_epochs", "1", "--model.num_minibatches", "2",
        "--trainer.max_steps", "100000", "--trainer.max_time", "null",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root), *extra,
    ]  # fmt: skip


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), e.get("PYTHONPATH")) if p)
    e.setdefault("MUJOCO_GL", "egl")
    return e


def trained_updates(root: Path) -> int:
    """Updates this process trained: metrics.csv's ``step`` counts training steps (rollouts)."""
    path = root / "csv" / "version_0" / "metrics.csv"
    if not path.is_file():
        return 0
    with open(path) as f:
        return max((int(r["step"]) + 1 for r in csv.DictReader(f) if r.get("step")), default=0)


def ckpt_updates(root: Path) -> int | None:
    """Updates in ``<root>/checkpoints/last.ckpt`` (the module's policy version), None if absent."""
    path = root / "checkpoints" / "last.ckpt"
    if not path.is_file():
        return None
    return int(safe_load(path, flag="--root")["state_dict"]["_policy_version"])


def newest_child(pid: int) -> int:
    """The trainer's last-started spawned child: the inference worker, started after its samplers."""
    return max(spawned_descendants(pid), key=start_ticks)


def forkserver_of(trainer: int) -> int:
    """The trainer's forkserver: its child running multiprocessing's forkserver ``main``."""
    for pid in descendants(trainer):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if parent_pid(pid) == trainer and b"multiprocessing.forkserver" in cmdline:
            return pid
    raise RuntimeError(f"no forkserver below pid {trainer}")


def rows_logged(metrics: Path) -> int:
    return len(metrics.read_text().splitlines()) if metrics.is_file() else 0


def recover(
    proc: subprocess.Popen, log: Path, metrics: Path, t0: float, timeout: float = 240.0
) -> float | None:  # noqa: E501
    """Seconds from ``t0`` until the run restarted a sampler and logged one more update after it;
    None if the run stopped instead."""
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        if "; restarting" in log.read_text():  # a sampler, or the inference worker with its samplers
            rows = rows_logged(metrics)
            while proc.poll() is None and time.monotonic() - t0 < timeout:
                if rows_logged(metrics) > rows:
                    return time.monotonic() - t0
                time.sleep(0.1)
            return None
        time.sleep(0.1)
    return None


def last_logged(root: Path, key: str) -> float | None:
    path = root / "csv" / "version_0" / "metrics.csv"
    if not path.is_file():
        return None
    with open(path) as f:
        values = [float(r[key]) for r in csv.DictReader(f) if r.get(key)]
    return values[-1] if values else None


#: A 2-rank DDP run (gloo on CPU, Lightning's launcher), one sampler per rank, through the command's
#: own entry (each rank warms a forkserver).
DDP = ("--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu",
       "--data.num_workers", "1", "--data.num_envs", "1")  # fmt: skip


def rank_pid(launcher: int, rank: int) -> int:
    """Local rank ``rank`` below Lightning's launcher (not a forkserver or a sampler: they run ``-c``)."""
    for pid in descendants(launcher):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"fit" in cmdline and b"-c" not in cmdline and f"LOCAL_RANK={rank}".encode() in environ:
            return pid
    raise RuntimeError(f"no rank {rank} below pid {launcher}")


def run(name: str, root: Path, inject: str | None, extra: tuple[str, ...] = (), *, ddp: bool = False,
        **kw) -> dict:  # fmt: skip
    """Start a run; ``inject`` is a signal name (sent once updates are logged), ``SAMPLER:<signal>``
    (sent to one sampler process; recovery is timed, then SIGTERM ends the run), ``FORKSERVER:<signal>``
    (to the forkserver the command's entry warmed; the same), ``RANK1:<signal>``
    (to DDP rank 1 alone), ``GROUP:<signal>`` / ``GROUP2:<signal>`` (to the whole process group, once /
    twice 0.5 s apart), or None (the fault is in the settings / env and the run stops by itself)."""
    log = root.parent / f"{root.name}.log"
    cmd = command(root, *(DDP if ddp else ()), *extra, **kw)
    if ddp or (inject or "").startswith("FORKSERVER:"):  # the command's entry: it warms a forkserver
        cmd[1:3] = ["-m", "fastlight"]
    with open(log, "w") as f:  # its own session: GROUP signals reach its process group only
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env(), start_new_session=True)
    children: set[int] = set()
    t_inject = time.monotonic()
    recovered = None
    metrics = root / "csv" / "version_0" / "metrics.csv"
    while proc.poll() is None:
        children |= descendants(proc.pid)
        if inject and rows_logged(metrics) >= 3:
            t_inject = time.monotonic()
            if inject.startswith(("SAMPLER:", "INFERENCE:", "FORKSERVER:")):
                if inject.startswith("SAMPLER:"):
                    target = spawned_descendants(proc.pid)[0]
                elif inject.startswith("FORKSERVER:"):
                    target = forkserver_of(proc.pid)
                else:
                    target = newest_child(proc.pid)
                os.kill(target, getattr(signal, inject.split(":")[1]))
                recovered = recover(proc, log, metrics, t_inject)
                children |= descendants(proc.pid)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            elif inject.startswith("RANK1:"):
                os.kill(rank_pid(proc.pid, 1), getattr(signal, inject.split(":")[1]))
            elif inject.startswith(("GROUP:", "GROUP2:")):
                os.killpg(proc.pid, getattr(signal, inject.split(":")[1]))
                if inject.startswith("GROUP2:"):
                    time.sleep(0.5)
                    os.killpg(proc.pid, getattr(signal, inject.split(":")[1]))
            else:
                proc.send_signal(getattr(signal, inject))
            break
        time.sleep(0.1)
    rc = proc.wait(timeout=600)
    seconds = time.monotonic() - t_inject
    time.sleep(2.0)
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.startswith("fastlight:")]
    saved = ckpt_updates(root)
    # max: a stop at an update's end leaves that update's metrics row unlogged, its weights saved.
    lost = None if saved is None else max(0, trained_updates(root) - saved)
    return {
        "fault": name,
        "rc": rc,
        "line": lines[-1] if lines else text.strip().splitlines()[-1][:160],
        "seconds": seconds,
        "lost": lost,
        "recovered": recovered,
        "restarts": last_logged(root, "faults/worker_restarts"),
        "dropped": last_logged(root, "faults/dropped_rollouts"),
        "skipped": last_logged(root, "faults/skipped_updates"),
        "orphans": sum(alive(c) for c in children),
        "tracebacks": text.count("Traceback"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="fault names to run (default: all)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fastlight-faults-"))
    faults = {
        "SIGTERM": lambda r: run("SIGTERM", r, "SIGTERM"),
        "SIGINT": lambda r: run("SIGINT", r, "SIGINT"),
        "SIGUSR1": lambda r: run("SIGUSR1", r, "SIGUSR1"),
        "NaN reward": lambda r: run("NaN reward", r, None, env_kwargs='{"nan_reward_at": 30}'),
        "NaN observation": lambda r: run("NaN observation", r, None, env_kwargs='{"nan_obs_at": 30}'),
        "SIGKILL sampler": lambda r: run("SIGKILL sampler", r, "SAMPLER:SIGKILL"),
        "SIGSTOP sampler": lambda r: run(
            "SIGSTOP sampler", r, "SAMPLER:SIGSTOP", ("--data.faults.heartbeat_s", "5")
        ),
        "env hangs in step": lambda r: run(
            "env hangs in step",
            r,
            None,
            ("--data.faults.heartbeat_s", "5", "--trainer.max_steps", "40"),
            env_kwargs=json.dumps({"step_sleep": 0.02, "hang_at": 40, "hang_marker": str(r) + ".hang"}),
        ),
        "SIGKILL sampler, budget 0": lambda r: run(
            "SIGKILL sampler, budget 0", r, "SAMPLER:SIGKILL", ("--data.faults.max_worker_restarts", "0")
        ),
        "SIGKILL inference worker": lambda r: run(
            "SIGKILL inference worker", r, "INFERENCE:SIGKILL", ("--data.inference", "{}")
        ),
        "SIGKILL inference worker, budget 0": lambda r: run(
            "SIGKILL inference worker, budget 0",
            r,
            "INFERENCE:SIGKILL",
            ("--data.inference", "{}", "--data.faults.max_worker_restarts", "0"),
        ),
        "huge reward -> NaN loss": lambda r: run(
            "huge reward -> NaN loss",
            r,
            None,
            ("--model.max_nonfinite_updates", "1"),
            env_kwargs='{"step_sleep": 0.02, "nan_reward_at": 30, "nan_value": 3e38}',
        ),
        "num_minibatches 1000": lambda r: run(
            "num_minibatches 1000", r, None, ("--model.num_minibatches", "1000")
        ),  # noqa: E501
        "forkserver SIGKILL with 4 samplers": lambda r: run(
            "forkserver SIGKILL with 4 samplers",
            r,
            "FORKSERVER:SIGKILL",
            ("--data.num_workers", "4", "--data.num_envs", "4"),
        ),
        "DDP SIGTERM rank 1": lambda r: run("DDP SIGTERM rank 1", r, "RANK1:SIGTERM", ddp=True),
        "DDP SIGTERM group": lambda r: run("DDP SIGTERM group", r, "GROUP:SIGTERM", ddp=True),
        "DDP SIGTERM group twice": lambda r: run("DDP SIGTERM group twice", r, "GROUP2:SIGTERM", ddp=True),
        "DDP SIGINT group": lambda r: run("DDP SIGINT group", r, "GROUP:SIGINT", ddp=True),
    }
    rows = []
    for name, fn in faults.items():
        if args.only and name not in args.only:
            continue
        rows.append(fn(tmp / name.replace(" ", "_")))
    # Resume past max_steps, and with a changed lr: from the SIGTERM run's checkpoint if there is one.
    src = tmp / "SIGTERM" / "checkpoints" / "last.ckpt"
    if src.is_file():
        step = 2 * ckpt_updates(tmp / "SIGTERM")  # 2 optimizer steps per update
        past = ("--ckpt_path", str(src), "--trainer.max_steps", "2")
        rows.append(run("resume past max_steps", tmp / "past", None, past))
        lr = ("--ckpt_path", str(src), "--trainer.max_steps", str(step + 4), "--model.lr", "0.01")
        rows.append(run("resume --model.lr 0.01", tmp / "lr", None, lr))
    print(
        "| fault | exit code | seconds to stop / run wall time | seconds to recovery | updates lost | "
        "restarts | rollouts dropped | skipped steps | orphans | tracebacks | line |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rec = "-" if r["recovered"] is None else f"{r['recovered']:.1f}"
        print(
            f"| {r['fault']} | {r['rc']} | {r['seconds']:.1f} | {rec} | {r['lost']} | {r['restarts']} "
            f"| {r['dropped']} | {r['skipped']} | {r['orphans']} | {r['tracebacks']} | `{r['line']}` |"
        )


if __name__ == "__main__":
    main()
