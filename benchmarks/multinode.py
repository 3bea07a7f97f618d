"""Two simulated nodes vs one process, at equal total envs: ``python -m benchmarks.multinode``.

    python -m benchmarks.multinode                      # 2 rounds of A B, 30 s of training each
    python -m benchmarks.multinode --rounds 3 --seconds 60 --envs 8 --max-horizon 200   # the config's sizes

A, two nodes: two ``torchrun --nnodes 2 --nproc_per_node 1 --node_rank {0,1}`` process trees on
localhost (each in its own session and ``default_root_dir``), one DDP rank (gloo, CPU) per node with
``--envs / 2`` envs in one sampler. B, one process: ``fastlight fit`` with ``--envs`` envs in two
samplers. Both run ``configs/highway_dpsa.yaml`` (its update: 4 epochs x 4 minibatches, 2 DPSA
cycles per update) with DPSA cycles of at most ``--max-horizon`` steps, for ``--trainer.max_time``
``--seconds``; the runs alternate A B A B, so both see the same machine.

Read from rank 0's ``metrics.csv`` (``env_steps``: the job's, summed over ranks) and the same
version's TensorBoard clock (:func:`fastlight.plot.wall_times`), after ``--warmup`` updates:
env-steps/s is the env steps trained on per second of wall time, time per update the seconds
between consecutive updates; ``perf/effective_tps`` is RolloutThroughput's own logged rate (median
over the same updates). Writes a Markdown report to ``--out`` (and prints it).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import REPO_ROOT, child_env
from benchmarks.procfs import descendants
from fastlight.plot import find_metrics, read_columns, wall_times
from fastlight.procs import alive

ROOT = REPO_ROOT
CONFIG = "configs/highway_dpsa.yaml"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def env() -> dict[str, str]:
    """The runs' environment: no launcher variables of a job this script might run under."""
    launch_vars = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "WORLD_SIZE", "RANK", "LOCAL_RANK")
    e = {k: v for k, v in child_env().items() if k not in launch_vars}
    e.setdefault("MUJOCO_GL", "egl")
    return e


def fit_args(root: Path, seconds: int, horizon: int, *extra: str) -> list[str]:
    return [
        "fit", "--config", CONFIG, "--trainer.max_time", f"00:00:{seconds // 60:02d}:{seconds % 60:02d}",
        "--data.max_horizon", str(horizon),
        "--trainer.max_steps", "1000000", "--data.steps_per_epoch", "100000",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root), *extra,
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(root: Path, envs: int, seconds: int, horizon: int) -> list[list[str]]:
    port = free_port()
    return [
        [str(TORCHRUN), "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(rank),
         "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "fastlight",
         *fit_args(root / f"node{rank}", seconds, horizon, "--trainer.strategy", "ddp",
                   "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.num_nodes", "2",
                   "--data.num_envs", str(envs // 2), "--data.num_workers", "1")]
        for rank in (0, 1)
    ]  # fmt: skip


def one_process(root: Path, envs: int, seconds: int, horizon: int) -> list[list[str]]:
    return [[sys.executable, "-m", "fastlight",
             *fit_args(root, seconds, horizon, "--data.num_envs", str(envs),
                       "--data.num_workers", "2")]]  # fmt: skip


def launch(commands: list[list[str]], logs: list[Path], timeout: float) -> float:
    """Run the commands at once, each in its own session; wall seconds until all have exited 0. On a
    timeout or an interrupt every process they started is killed: torchrun gives each rank a session
    of its own, so their process groups alone would leave the ranks and samplers running."""
    t0 = time.monotonic()
    procs = []
    for cmd, log in zip(commands, logs, strict=True):
        with open(log, "w") as f:
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env(), cwd=ROOT,
                                          start_new_session=True))  # fmt: skip
    family: set[int] = set()
    finished = False
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() - t0 > timeout:
                raise SystemExit(f"benchmarks.multinode: the run did not end within {timeout:.0f} s")
            for p in procs:
                family |= descendants(p.pid)
            time.sleep(0.5)
        finished = True
    finally:
        if not finished:  # only then: after a clean exit the pids may already belong to others
            live = {pid for pid in family if alive(pid)}
            for p in procs:
                if p.poll() is None:
                    live |= descendants(p.pid) | {p.pid}
            for pid in live:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for p in procs:
            p.wait()
    for p, log in zip(procs, logs, strict=True):
        if p.returncode != 0:
            raise SystemExit(f"benchmarks.multinode: {shlex.join(p.args)} exited {p.returncode}; see {log}")
    return time.monotonic() - t0


def measure(metrics_root: Path, warmup: int) -> dict[str, float]:
    """Rates after ``warmup`` updates, from rank 0's metrics.csv and its TensorBoard clock."""
    metrics = find_metrics(metrics_root, None)
    cols = read_columns(metrics)
    clock = wall_times(metrics, "env_steps")
    # perf/effective_tps is not logged for the first Rollout (it only starts RolloutThroughput's clock).
    logged_tps = cols.get("perf/effective_tps", [math.nan] * len(cols["step"]))
    rows = [(int(s), e, tps) for s, e, tps in zip(cols["step"], cols["env_steps"], logged_tps, strict=True)
            if not math.isnan(e)]  # fmt: skip
    rows = [r for r in rows if r[0] in clock][warmup:]
    if len(rows) < 2:
        raise SystemExit(f"benchmarks.multinode: {metrics} has {len(rows)} updates after --warmup {warmup}")
    (s0, e0, _), (s1, e1, _) = rows[0], rows[-1]
    dt = clock[s1] - clock[s0]
    tps = [t for _, _, t in rows[1:] if not math.isnan(t)]
    return {
        "updates": len(rows) - 1,
        "env_steps_per_s": (e1 - e0) / dt,
        "s_per_update": dt / (len(rows) - 1),
        "effective_tps": statistics.median(tps) if tps else math.nan,
        "env_steps": e1,
    }


def report(results: list[dict[str, Any]], argv: list[str], args: argparse.Namespace, note: str) -> str:
    lines = [
        "# Two simulated nodes vs one process (equal total envs)",
        "",
        f"`{CONFIG}` (its update: 4 epochs x 4 minibatches = 16 optimizer steps on the Rollout of 2 DPSA "
        f"cycles), {args.envs} envs in all, cycles of at most {args.max_horizon} steps "
        f"(`--data.max_horizon`), {args.seconds} s of training per run (`--trainer.max_time`), the first "
        f"{args.warmup} update(s) skipped, runs interleaved A B A B:",
        "",
        f"- **A, two nodes**: two `torchrun --nnodes 2 --nproc_per_node 1 --node_rank {{0,1}}` process trees "
        f"on localhost, one DDP rank (gloo, CPU) per node, {args.envs // 2} envs in 1 sampler each;",
        f"- **B, one process**: `fastlight fit`, {args.envs} envs in 2 samplers.",
        "",
        "Command (from the repository root; it writes this file):",
        "",
        "```bash",
        shlex.join(["python", "-m", "benchmarks.multinode", *shown(argv)]),
        "```",
        "",
        "env-steps/s: env steps trained on (rank 0's `env_steps`, the job's sum over ranks) per second of "
        "wall time (its TensorBoard clock); s/update: seconds between consecutive updates; "
        "`perf/effective_tps`: RolloutThroughput's logged rate, median; wall: the whole run, start-up "
        "included.",
        "",
        "| run | setup | updates | env-steps/s | s/update | perf/effective_tps | wall s "
        "| load avg (1 min) before |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(results, 1):
        lines.append(
            f"| {i} | {r['kind']} | {r['updates']} | {r['env_steps_per_s']:.1f} | {r['s_per_update']:.2f} | "
            f"{r['effective_tps']:.1f} | {r['wall_s']:.0f} | {r['load_before']:.1f} |"
        )
    lines += ["", "| setup | env-steps/s (mean) | s/update (mean) | vs one process |", "|---|---|---|---|"]
    means = {}
    for kind in ("A: two nodes", "B: one process"):
        runs = [r for r in results if r["kind"] == kind]
        means[kind] = (statistics.mean(r["env_steps_per_s"] for r in runs),
                       statistics.mean(r["s_per_update"] for r in runs))  # fmt: skip
    base = means["B: one process"][0]
    for kind, (rate, upd) in means.items():
        lines.append(f"| {kind} | {rate:.1f} | {upd:.2f} | {rate / base:.2f}x |")
    lines += ["", "## Conditions", "", note] if note else []
    return "\n".join(lines) + "\n"


def shown(argv: list[str]) -> list[str]:
    """``argv`` less ``--note``'s text (the report prints it under Conditions)."""
    out, skip = [], False
    for a in argv:
        if skip or a.startswith("--note="):
            skip = False
            continue
        skip = a == "--note"
        if not skip:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.multinode", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="A B pairs (default 2)")
    p.add_argument("--seconds", type=int, default=30, help="training seconds per run (default 30)")
    p.add_argument("--envs", type=int, default=4, help="envs in all, an even number (default 4)")
    p.add_argument("--max-horizon", type=int, default=10, help="--data.max_horizon (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="updates skipped at the start (default 1)")
    p.add_argument("--out", default="benchmarks/results/multinode.md", help="the Markdown report")
    p.add_argument("--note", default="", help="a paragraph on the machine's conditions, for the report")
    args = p.parse_args(argv)
    if args.envs < 2 or args.envs % 2:
        p.error(f"--envs must be an even number >= 2 (split over 2 nodes), got {args.envs}")
    results = []
    with tempfile.TemporaryDirectory(prefix="fastlight-multinode-") as tmp:
        for i in range(args.rounds):
            for kind, build in (("A: two nodes", two_nodes), ("B: one process", one_process)):
                root = Path(tmp) / f"{i}{kind[0]}"
                commands = build(root, args.envs, args.seconds, args.max_horizon)
                logs = [Path(tmp) / f"{i}{kind[0]}{n}.log" for n in range(len(commands))]
                load = os.getloadavg()[0]
                wall = launch(commands, logs, timeout=args.seconds + 300)
                m = measure(root / "node0" if len(commands) == 2 else root, args.warmup)
                results.append({"kind": kind, "wall_s": wall, "load_before": load, **m})
                print(f"benchmarks.multinode: {kind}, round {i + 1}: {m['env_steps_per_s']:.1f} env-steps/s, "
                      f"{m['s_per_update']:.2f} s/update, {m['updates']} updates, {wall:.0f} s",
                      flush=True)  # fmt: skip
    text = report(results, argv, args, args.note)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
