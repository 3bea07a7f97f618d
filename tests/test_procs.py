"""fastlight.procs: the heartbeat's timeout rule and messages, the ``/proc`` readers, the owned lock,
children (and the forkserver) that ignore the stop signals."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from benchmarks.procfs import cpu_seconds, descendants, memory_mb, spawned_descendants, start_ticks
from fastlight.procs import (
    STOP_SIGNALS,
    HeartbeatLimits,
    Liveness,
    OwnedLock,
    alive,
    children_ignore_stop_signals,
    parent_pid,
    state,
)

CTX = mp.get_context("spawn")
LIMITS = HeartbeatLimits(1.0, 5.0, "--data.faults.heartbeat_s", "--data.faults.worker_timeout_s")


def test_liveness_gives_a_starting_child_the_start_limit_then_the_heartbeat_limit():
    live = Liveness(CTX, LIMITS)
    t0 = time.monotonic()
    live.reset()
    assert not live.started and live.hang(t0 + 4.9) is None  # starting: max(1, 5) = 5 s
    hung = live.hang(t0 + 5.3)
    assert hung is not None and hung.endswith("s (--data.faults.worker_timeout_s, while starting 5)")
    assert hung.startswith("made no progress for 5.")

    live.beat()
    assert live.hang(t0 + 6.0) is None and live.started  # it moved: silence counts from t0 + 6
    assert live.silent_for(t0 + 6.5) == pytest.approx(0.5)
    assert live.hang(t0 + 7.0) is None  # exactly the limit is not a hang
    assert live.hang(t0 + 7.2) == "made no progress for 1.2 s (--data.faults.heartbeat_s 1)"
    live.beat()
    assert live.hang(t0 + 7.3) is None  # any change counts, not its size or a clock in the child


def test_liveness_restart_goes_back_to_the_start_limit_and_a_long_heartbeat_wins():
    live = Liveness(CTX, LIMITS)
    live.beat()
    live.reset()
    assert live.started and live.counter.value == 1
    live.reset(restart=True)
    t0 = time.monotonic()
    assert live.counter.value == 0 and not live.started and live.hang(t0 + 4.0) is None
    slow = Liveness(CTX, HeartbeatLimits(heartbeat_s=10.0, start_timeout_s=2.0))  # max(heartbeat, start)
    slow.reset()
    assert slow.hang(time.monotonic() + 9.0) is None
    assert slow.hang(time.monotonic() + 10.5).endswith("(start_timeout_s, while starting 10)")
    assert Liveness(CTX).hang(time.monotonic() + 1e9) is None  # no limits set: never hung


def test_liveness_without_shared_memory_follows_the_reported_count():
    """A Ray actor's liveness: the watcher holds the counter and sets it from the actor's replies."""
    live = Liveness(None, LIMITS)
    t0 = time.monotonic()
    live.reset()
    live.report(0)  # an answer before its first beat: still starting
    assert not live.started and live.hang(t0 + 4.9) is None
    live.report(3)
    assert live.hang(t0 + 5.0) is None and live.started
    live.report(3)  # the same count again is no progress
    assert live.hang(t0 + 6.2) == "made no progress for 1.2 s (--data.faults.heartbeat_s 1)"


def test_proc_readers_follow_a_child_a_grandchild_and_a_zombie():
    me = os.getpid()
    assert parent_pid(me) == os.getppid() and state(me) == "R" and alive(me)
    assert parent_pid(2**22 + 12345) is None and state(2**22 + 12345) is None
    shell = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(60)'; true"])
    spawned = CTX.Process(target=time.sleep, args=(60,), daemon=True)
    spawned.start()
    grandchild = None
    try:
        deadline = time.monotonic() + 30
        while not descendants(shell.pid):
            assert time.monotonic() < deadline, "the grandchild never appeared"
            time.sleep(0.05)
        (grandchild,) = descendants(shell.pid)
        assert parent_pid(grandchild) == shell.pid and {shell.pid, grandchild, spawned.pid} <= descendants(me)
        assert start_ticks(grandchild) >= start_ticks(shell.pid) >= start_ticks(me)
        spawned_ones = spawned_descendants(me)  # multiprocessing's children only, not the shell's
        assert spawned.pid in spawned_ones and not {shell.pid, grandchild} & set(spawned_ones)
        shell.kill()  # not reaped yet: a zombie, which is not alive
        deadline = time.monotonic() + 10
        while state(shell.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state(shell.pid) == "Z" and not alive(shell.pid)
        shell.wait()
        assert state(shell.pid) is None and not alive(shell.pid)
    finally:
        shell.kill()
        shell.wait()
        spawned.kill()
        spawned.join()
        if grandchild is not None and alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_memory_parts_add_up_and_cpu_seconds_grow():
    mem = memory_mb(os.getpid())
    assert mem["VmRSS"] > 10
    assert mem["VmRSS"] == pytest.approx(mem["RssAnon"] + mem["RssFile"] + mem["RssShmem"], abs=0.01)
    before = cpu_seconds(os.getpid())
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    assert cpu_seconds(os.getpid()) - before >= 0.2
    with pytest.raises(ProcessLookupError):
        cpu_seconds(2**22 + 12345)


def test_owned_lock_is_freed_only_for_its_holder():
    lock = OwnedLock(CTX)
    lock.__enter__()
    assert not lock.release_if_held_by(os.getpid() + 1) and not lock.release_if_held_by(0)
    assert lock.release_if_held_by(os.getpid())  # as the pool does for a killed holder
    with lock:  # free again
        pass
    assert not lock.release_if_held_by(os.getpid())


def ignored_signals(pid: int) -> set[int]:
    """The signals process ``pid`` ignores (its SigIgn mask in /proc)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigIgn:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    raise AssertionError("no SigIgn line")


def signal_set(pid: int, field: str) -> set[int]:
    """The signals in process ``pid``'s ``field`` mask of /proc (``SigIgn``, ``SigBlk``)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(f"{field}:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    raise AssertionError(f"no {field} line")


CHILD_IGNORES = (
    "import sys\n"
    "from fastlight.procs import ignore_stop_signals\n"
    "def masks():\n"
    "    return [l.split()[1] for l in open('/proc/self/status') if l.startswith(('SigBlk:', 'SigIgn:'))]\n"
    "before = masks()\n"
    "ignore_stop_signals()\n"
    "print(*before, *masks(), flush=True)\n"
)


def test_a_child_started_from_a_thread_has_the_stop_signals_blocked_until_it_ignores_them():
    """From a thread other than the main one (the prefetch thread restarts samplers), where Python
    cannot set a disposition, the block blocks the stop signals in that thread: the child starts with
    them blocked (a group SIGTERM during its start-up is not delivered), then ignores them and
    unblocks them in ``start_child``; the thread's own mask is back after the block."""
    stop = {int(s) for s in STOP_SIGNALS}
    out: dict[str, object] = {}

    def start() -> None:
        before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        with children_ignore_stop_signals():
            child = subprocess.Popen([sys.executable, "-c", CHILD_IGNORES], stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": os.getcwd()})  # fmt: skip
        out["thread_mask_back"] = signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
        out["masks"] = child.communicate(timeout=120)[0].split()

    thread = threading.Thread(target=start)
    thread.start()
    thread.join(150)

    def bits(mask: str) -> set[int]:
        return {n for n in range(1, 65) if int(mask, 16) >> (n - 1) & 1}

    blocked_before, ignored_before, blocked_after, ignored_after = (bits(m) for m in out["masks"])
    assert stop <= blocked_before and not stop & ignored_before  # started blocked, not yet ignored
    assert stop <= ignored_after and not stop & blocked_after  # then ignored, and unblocked
    assert out["thread_mask_back"] is True
    assert not stop & signal_set(os.getpid(), "SigBlk")  # the trainer still receives them


def test_children_and_the_forkserver_ignore_the_stop_signals():
    """A signal to the whole process group (Ctrl-C, ``kill -TERM -PGID``, ``scancel``) is the
    trainer's to handle: a child started inside the block, and the warmed forkserver with every
    sampler forked from it, ignore SIGINT, SIGTERM and SIGUSR1 from their first instruction; the
    trainer's own handlers are back after the block."""
    stop = {int(s) for s in STOP_SIGNALS}
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    with children_ignore_stop_signals():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert stop <= ignored_signals(child.pid)
    finally:
        child.kill()
        child.wait()
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before
    # The forkserver, warmed in a fresh process as `fastlight fit` does it.
    script = (
        "import sys, time\n"
        "from multiprocessing import forkserver\n"
        "from fastlight.fleet.start import warm_forkserver\n"
        "assert warm_forkserver()\n"
        "print(forkserver._forkserver._forkserver_pid, flush=True)\n"
        "sys.stdin.readline()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})  # fmt: skip
    server = int(proc.stdout.readline())
    try:
        assert stop <= ignored_signals(server)
        assert not stop & ignored_signals(proc.pid)  # the trainer itself handles them
    finally:
        os.kill(server, signal.SIGKILL)  # still importing its preload modules: not worth the wait
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()
