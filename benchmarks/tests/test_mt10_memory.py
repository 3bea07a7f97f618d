"""The MT10 memory bench's task log: what each sampler process met, read back next to its memory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np

from benchmarks.vla import mt10_memory
from fastlight.procs import alive


class _Tasks(gym.Env):
    """Resets into the task ids it is given, in turn."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,))
    action_space = gym.spaces.Box(-1.0, 1.0, (1,))

    def __init__(self, tasks: list[int]) -> None:
        self.tasks = list(tasks)

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, dtype=np.float32), {"task_id": self.tasks.pop(0)}


def test_task_log_counts_tasks_and_env_task_pairs_and_is_read_for_descendants_only(tmp_path, monkeypatch):
    monkeypatch.setattr(mt10_memory, "_MET", set())
    log = mt10_memory.TaskLog(str(tmp_path))
    a, b = log.wrap(_Tasks([3, 3, 5])), log.wrap(_Tasks([3]))
    for env in (a, a, b, a):
        env.reset()
    written = json.loads((tmp_path / f"{os.getpid()}.json").read_text())
    assert written["tasks"] == [3, 5] and written["pairs"] == 3  # (a, 3), (b, 3), (a, 5)
    assert written["env_module"] == __file__ and set(written["heavy"]) <= set(mt10_memory.HEAVY_MODULES)
    # This process is below its parent, not below itself: read for the one, not for the other.
    (row,) = mt10_memory.read_samplers(os.getppid(), str(tmp_path))
    assert row["pid"] == os.getpid() and row["tasks_met"] == 2 and row["pairs_met"] == 3
    assert row["VmRSS"] > 10 and row["RssAnon"] > 0
    assert mt10_memory.read_samplers(os.getpid(), str(tmp_path)) == []


def test_stop_group_ends_the_run_and_its_children():
    """The run's process group goes, a child that ignores SIGTERM (a sampler outliving it) too."""
    child = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print(os.getpid(), flush=True); time.sleep(60)"
    )
    code = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    grandchild = int(proc.stdout.readline())
    mt10_memory.stop_group(proc, grace_s=5.0)
    assert proc.returncode == -signal.SIGTERM
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:  # a zombie until init reaps it
        time.sleep(0.05)
    assert not alive(grandchild)
