"""Readers of Linux's ``/proc`` that the tests and benchmarks use to find a run's processes (orphans,
restarts) and to measure their CPU time and memory."""

from __future__ import annotations

import os
from pathlib import Path

from fastlight.procs import parent_pid, stat_fields


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, grandchildren...), from ``/proc``'s parent links."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (ppid := parent_pid(int(entry))) is not None:
            parents[int(entry)] = ppid
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - out
        out |= frontier
    return out


def spawned_descendants(pid: int) -> list[int]:
    """The processes below ``pid`` started by multiprocessing's spawn (samplers, the inference worker),
    not its resource tracker, sorted by pid."""
    out = []
    for c in sorted(descendants(pid)):
        try:
            if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes():
                out.append(c)
        except OSError:
            pass
    return out


def start_ticks(pid: int) -> int:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    fields = stat_fields(pid)
    if not fields:
        raise ProcessLookupError(f"no process {pid} in /proc")
    return int(fields[19])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used, from ``/proc/<pid>/stat``."""
    fields = stat_fields(pid)
    if not fields:
        raise ProcessLookupError(f"no process {pid} in /proc")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mb(pid: int) -> dict[str, float]:
    """``VmRSS``, ``RssAnon``, ``RssFile``, ``RssShmem`` (``/proc/<pid>/status``) and ``Pss``
    (``smaps_rollup``) in MB.

    ``VmRSS`` is the sum of the three ``Rss*`` parts: anonymous memory (heap, copy-on-write pages
    shared with a forkserver), file pages (shared libraries' code and data a process has touched)
    and shared memory (the weight buffers). ``Pss`` charges each shared page (libtorch's code,
    mapped by every sampler) to its sharers in equal parts: the memory one more sampler really
    costs, where ``VmRSS`` counts them in full.
    """
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(line.split()[1]) / 1024
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["Pss"] = int(line.split()[1]) / 1024
    except OSError:  # kernels before 4.14 have no smaps_rollup
        pass
    return out
