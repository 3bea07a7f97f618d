"""Memory of a long ``fastlight fit`` run: each process's RSS, open fds and the run's ``/dev/shm`` files over
time, to tell a leak (growth without a plateau) from a warm-up.

    python -m benchmarks.soak --minutes 60 --every 30 -- --config configs/highway_dpsa.yaml

Everything after ``--`` goes to ``fastlight fit`` (``--trainer.max_time`` is set from ``--minutes``).
The run starts in its own process group; every ``--every`` seconds each process below it is read
from ``/proc`` (:func:`benchmarks.procfs.memory_mb`): the trainer, the forkserver and the samplers
(the forkserver's children). At the end it prints one row per reading and, per process, the slope
of ``RssAnon`` (MB/min) over the first and the second half of the run: a leak keeps its slope, a
warm-up (allocator arenas, caches filling) flattens. ``--out FILE`` also writes the readings as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.procfs import descendants, memory_mb


def _role(pid: int, trainer: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return "gone"
    if b"resource_tracker" in cmd:
        return "resource_tracker"
    if b"forkserver" in cmd and ppid == trainer:
        return "forkserver"
    return "sampler" if ppid != trainer or b"spawn_main" in cmd else "child"


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope, y per minute."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return 60.0 * sum((t - mx) * (y - my) for t, y in points) / var if var else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("fit_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    fit_args = [a for a in args.fit_args if a != "--"]
    seconds = int(args.minutes * 60)
    limit = f"00:{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    cmd = [sys.executable, "-m", "fastlight", "fit", *fit_args, "--trainer.max_time", limit]
    shm_before = set(os.listdir("/dev/shm"))
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    readings: list[dict] = []
    try:
        while proc.poll() is None:
            time.sleep(args.every)
            now = time.monotonic() - t0
            procs = {}
            for pid in sorted(descendants(proc.pid) | {proc.pid}):
                role = "trainer" if pid == proc.pid else _role(pid, proc.pid)
                try:
                    mem = memory_mb(pid)
                except OSError:
                    continue
                procs[str(pid)] = {"role": role, "fds": _fds(pid), **mem}
            shm = len(set(os.listdir("/dev/shm")) - shm_before)
            readings.append({"t": now, "procs": procs, "shm_new": shm})
            row = "  ".join(f"{p['role'][:7]}:{p.get('RssAnon', 0):.1f}/{p['fds']}" for p in procs.values())
            print(f"{now / 60:6.1f} min  shm+{shm}  {row}", flush=True)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        err = proc.communicate(timeout=120)[1].decode(errors="replace")
    print(f"exit {proc.returncode}; stderr tail: {err.strip().splitlines()[-1:] if err.strip() else ''}")
    if args.out is not None:
        args.out.write_text(json.dumps({"command": cmd, "readings": readings}, indent=1))
    half = readings[-1]["t"] / 2 if readings else 0.0
    pids = sorted({pid for r in readings for pid in r["procs"]}, key=int)
    print("process, role, RssAnon first -> last (MB), slope 1st / 2nd half (MB/min), fds first -> last")
    for pid in pids:
        pts = [(r["t"], r["procs"][pid]["RssAnon"]) for r in readings if "RssAnon" in r["procs"].get(pid, {})]
        if not pts:  # a process that exited between listing and reading
            continue
        fds = [r["procs"][pid]["fds"] for r in readings if pid in r["procs"]]
        role = next(r["procs"][pid]["role"] for r in readings if pid in r["procs"])
        first = _slope([p for p in pts if p[0] <= half])
        second = _slope([p for p in pts if p[0] > half])
        print(f"{pid} {role}: {pts[0][1]:.1f} -> {pts[-1][1]:.1f}; {first:+.3f} / {second:+.3f}; "
              f"{fds[0]} -> {fds[-1]}")  # fmt: skip


if __name__ == "__main__":
    main()
