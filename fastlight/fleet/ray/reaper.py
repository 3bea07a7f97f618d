"""The reaper of a Ray instance a :class:`~fastlight.fleet.ray.fleet.RayFleet` started itself.

Ray ends its gcs, raylet and workers when the driver (the trainer) is SIGKILLed, but its dashboard and
runtime-env agents wait a minute for the dead GCS first. :func:`start_reaper` starts a small process,
in its own session (a Ctrl-C to the trainer's process group does not reach it), that notes every
process below the instance's once a second and SIGKILLs those still running when its stdin closes:
the trainer stopped the fleet, or died however it died.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

#: The reaper's script (``python -c``, argv: the instance's process ids). Only noted pids with their start
#: time unchanged are killed: a pid the kernel reused belongs to someone else.
REAPER = r"""
import os, signal, sys, threading
roots, seen = {int(p) for p in sys.argv[1:]}, {}
def table():
    out = {}
    for e in os.listdir("/proc"):
        try:
            with open(f"/proc/{e}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(e)] = (int(fields[1]), fields[19])
        except (OSError, ValueError, IndexError):
            pass
    return out
def note():
    procs = table()
    frontier = {p for p in roots if p in procs}
    while frontier:
        for p in frontier:
            seen.setdefault(p, procs[p][1])
        frontier = {c for c, (parent, _) in procs.items() if parent in frontier and c not in seen}
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.buffer.read(), done.set()), daemon=True).start()
while not done.wait(1.0):
    note()
procs = table()
for pid, started in seen.items():
    if pid in procs and procs[pid][1] == started:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""


def start_reaper(ray: Any) -> subprocess.Popen | None:
    """Start :data:`REAPER` over the processes of the Ray instance this process just started (None
    where Ray does not say which they are)."""
    try:
        node = ray._private.worker._global_node
        pids = [info.process.pid for infos in node.all_processes.values() for info in infos]
    except AttributeError:
        return None
    # Its own session: a Ctrl-C to the trainer's process group does not reach it.
    return subprocess.Popen(
        [sys.executable, "-c", REAPER, *map(str, pids)], stdin=subprocess.PIPE, start_new_session=True
    )
