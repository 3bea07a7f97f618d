"""A dead forkserver is one fault, and nothing restarts once a stop has begun (real processes, real
signals).

Under the forkserver start method every sampler is a child of the forkserver and its exit code comes
through it: a SIGKILL of the forkserver makes all of them read as dead with exit code 255 at once.
That is one restart of the budget (not one per sampler), one line naming the forkserver, a new
forkserver (keeping the stop signals from its children, like the first) and new samplers on the
current weights. A stop that comes while a restart is under way waits for it and stops what it
started: no line, no process and no forkserver after it."""

from __future__ import annotations

import csv
import multiprocessing
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import forkserver
from pathlib import Path

import pytest

from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.pool import SamplerError, SamplerPool
from fastlight.fleet.start import PRELOAD, forkserver_pid
from fastlight.modules.rl_module import RLModule
from fastlight.procs import STOP_SIGNALS, alive, descendants, parent_pid
from fastlight.rollout import Rollout
from fastlight.sampling.worker import SamplerConfig
from tests.faults.test_cli_faults import assert_no_orphans, child_env, command, last_line, wait_for_training

pytestmark = [pytest.mark.multiproc]
ENV = "tests.fake_envs:FixedLength-v0"


@pytest.fixture
def preloading_forkserver() -> Iterator[None]:
    """The forkserver preloads the samplers' modules, as the ``fastlight`` command's does (the
    setting is the process's; it is put back after)."""
    context = multiprocessing.get_context("forkserver")
    before = list(forkserver._forkserver._preload_modules)
    context.set_forkserver_preload(PRELOAD)
    yield
    context.set_forkserver_preload(before)


def make_pool(samplers: int, max_restarts: int) -> tuple[SamplerPool, object]:
    module = RLModule(obs_dim=3, action_dim=2)
    module.configure_model()
    configs = [SamplerConfig(env_id=ENV, num_envs=1, max_horizon=4, seed=1000 * w) for w in range(samplers)]
    faults = FaultSettings(worker_timeout_s=120.0, max_worker_restarts=max_restarts)
    return SamplerPool(configs, module.policy, faults=faults, start_method="forkserver"), module.policy


def drive(pool: SamplerPool, done: Callable[[Rollout | None], bool], timeout: float = 120.0) -> None:
    """``pool.next_item`` from a thread, as the DataModule's prefetcher calls it (restarts happen
    there, outside the main thread), until ``done(item)``; re-raises what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            while not done(pool.next_item(0.2)):
                pass
        except BaseException as e:  # noqa: BLE001 - surfaced in the test's thread
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"not done within {timeout} s"
    if errors:
        raise errors[0]


def counting(version: int, n: int) -> Callable[[Rollout | None], bool]:
    """Done once ``n`` items of policy ``version`` arrived."""
    seen = [0]

    def done(item: Rollout | None) -> bool:
        if item is not None and int(item.policy_version.max()) == version:
            seen[0] += 1
        return seen[0] >= n

    return done


def signal_set(pid: int, field: str) -> set[int]:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(f"{field}:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    raise AssertionError(f"no {field} line")


def wait_gone(pids: set[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_a_killed_forkserver_is_one_fault_named_once_and_restarts_with_its_samplers(
    capfd, preloading_forkserver
):
    pool, policy = make_pool(4, max_restarts=1)  # one restart: four per-sampler faults would exhaust it
    pool.start()
    try:
        pool.publish(policy, 0)
        drive(pool, counting(0, 4))
        server = forkserver_pid()
        pids = [p.pid for p in pool.procs]
        assert server is not None and {parent_pid(p) for p in pids} == {server}
        capfd.readouterr()

        os.kill(server, signal.SIGKILL)
        t0 = time.monotonic()
        drive(pool, lambda _: pool.restarts >= 1)
        pool.publish(policy, 1)  # only the new samplers can serve it: the old ones are dead
        drive(pool, counting(1, 4))
        seconds = time.monotonic() - t0
        assert seconds < 60, seconds
        assert pool.restarts == 1 and pool.dropped_rollouts == 4
        new_server = forkserver_pid()
        new_pids = [p.pid for p in pool.procs]
        assert new_server not in (None, server) and alive(new_server)
        assert not set(new_pids) & set(pids) and {parent_pid(p) for p in new_pids} == {new_server}
        assert wait_gone(set(pids)) == []
        # Restarted from a thread, where dispositions cannot be set: the stop signals are blocked in the
        # new forkserver (ignored, not blocked, in the samplers, once started).
        stop = {int(s) for s in STOP_SIGNALS}
        assert stop <= signal_set(new_server, "SigIgn") | signal_set(new_server, "SigBlk")
        for pid in new_pids:
            assert stop <= signal_set(pid, "SigIgn") and not stop & signal_set(pid, "SigBlk")
        lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("fastlight:")]
        assert len(lines) == 1, lines
        assert re.fullmatch(
            rf"fastlight: the forkserver \(pid {server}\) died: killed by SIGKILL, and with it the 4 "
            rf"samplers it forked \(pids {', '.join(map(str, pids))}\); restarting the forkserver and its "
            r"4 samplers \(their rounds in flight dropped\) \(1 of 1 restarts in 600 s\); "
            r"exit code -9 is SIGKILL, .*",
            lines[0],
        ), lines[0]

        # The budget spent, the next forkserver death stops the run, naming the forkserver.
        os.kill(new_server, signal.SIGKILL)
        with pytest.raises(SamplerError) as info:
            drive(pool, lambda _: False)
        assert str(info.value).startswith(
            f"the forkserver (pid {new_server}) died: killed by SIGKILL, and with it the 4 samplers it "
            f"forked (pids {', '.join(map(str, new_pids))}); restart budget exhausted: 1 restarts in the "
            "last 600 s (--data.faults.max_worker_restarts 1 per --data.faults.restart_window_s 600)"
        ), str(info.value)
        assert pool.restarts == 1
    finally:
        pool.stop()
    assert wait_gone(set(new_pids)) == []


def test_a_stop_during_a_forkserver_restart_waits_for_it_and_nothing_restarts_after(
    capfd, preloading_forkserver, monkeypatch
):
    pool, policy = make_pool(2, max_restarts=3)
    pool.start()
    pool.publish(policy, 0)
    drive(pool, counting(0, 2))
    real_spawn = SamplerPool._spawn
    restarting = threading.Event()

    def slow_spawn(self: SamplerPool, i: int):  # a restart's spawn, slow: the stop comes during it
        restarting.set()
        time.sleep(1.0)
        return real_spawn(self, i)

    monkeypatch.setattr(SamplerPool, "_spawn", slow_spawn)
    server = forkserver_pid()
    capfd.readouterr()
    os.kill(server, signal.SIGKILL)
    watcher = threading.Thread(target=lambda: drive(pool, lambda _: pool.stop_event.is_set()), daemon=True)
    watcher.start()
    assert restarting.wait(30), "the forkserver's death was not seen"
    pool.stop()
    new_server = forkserver_pid()
    said = capfd.readouterr().err
    watcher.join(10)
    time.sleep(2.0)  # a restart that outlived the stop would start and say something by now
    later = capfd.readouterr().err
    lines = [line for line in said.splitlines() if line.startswith("fastlight:")]
    assert len(lines) == 1 and "restarting the forkserver and its 2 samplers" in lines[0], said
    assert "fastlight:" not in later, later
    assert pool.restarts == 1 and pool.samplers == []
    assert forkserver_pid() == new_server != server  # started before the stop returned, none after
    # What the restart started (under the stop's wait) is stopped too: nothing the new server forked runs.
    assert wait_gone(descendants(new_server), timeout=5.0) == []
    # And a fault seen after the stop restarts nothing.
    os.kill(new_server, signal.SIGKILL)
    pool.watch(force=True)
    assert pool.restarts == 1 and forkserver_pid() == new_server
    assert "fastlight:" not in capfd.readouterr().err


ROOT = Path(__file__).resolve().parents[2]


def forkserver_of(trainer: int) -> int:
    """The trainer's forkserver: its child running multiprocessing's forkserver ``main``."""
    for pid in descendants(trainer):
        try:
            if (
                parent_pid(pid) == trainer
                and b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
            ):
                return pid
        except OSError:
            continue
    raise AssertionError(f"no forkserver below pid {trainer}")


@pytest.mark.slow
def test_fit_survives_a_forkserver_sigkill_with_four_samplers_then_stops_without_restarting(tmp_path):
    """A real ``fastlight fit`` (the command's entry, which warms the forkserver) with 4 samplers:
    SIGKILL the forkserver -> one line naming it, ``faults/worker_restarts`` 1 and
    ``faults/dropped_rollouts`` 4, training goes on; then SIGTERM -> 143, and the stop line is the
    last: no restart, no new forkserver, no process after it."""
    root = tmp_path / "run"
    log = tmp_path / "run.log"
    cmd = command(root, "--data.num_workers", "4", "--data.num_envs", "4")
    cmd[1:3] = ["-m", "fastlight"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT)
    try:
        wait_for_training(proc, root)
        children = descendants(proc.pid)
        server = forkserver_of(proc.pid)
        os.kill(server, signal.SIGKILL)
        t0 = time.monotonic()
        metrics = root / "csv" / "version_0" / "metrics.csv"
        while "restarting the forkserver" not in log.read_text():
            assert proc.poll() is None and time.monotonic() - t0 < 60, log.read_text()[-3000:]
            time.sleep(0.2)
        rows = len(metrics.read_text().splitlines())
        while len(metrics.read_text().splitlines()) <= rows + 1:  # two updates after the restart
            assert proc.poll() is None and time.monotonic() - t0 < 120, log.read_text()[-3000:]
            time.sleep(0.2)
        children |= descendants(proc.pid)
        new_server = forkserver_of(proc.pid)
        assert new_server != server
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert rc == 143, text[-3000:]
    lines = [line for line in text.splitlines() if line.startswith("fastlight:")]
    named = [line for line in lines if "died" in line]
    assert len(named) == 1 and named[0].startswith(
        f"fastlight: the forkserver (pid {server}) died: killed by SIGKILL, and with it the 4 samplers"
    ), lines
    assert "restarting the forkserver and its 4 samplers" in named[0]
    assert last_line(log).startswith("fastlight: stopped by SIGTERM at global step "), lines
    assert "restarting" not in text.split("fastlight: stopped by SIGTERM")[1]
    assert "Traceback" not in text, text[-3000:]
    with open(metrics) as f:
        logged = [r for r in csv.DictReader(f) if r.get("faults/worker_restarts")]
    assert float(logged[-1]["faults/worker_restarts"]) == 1.0  # one fault, not one per sampler
    assert float(logged[-1]["faults/dropped_rollouts"]) == 4.0
    assert_no_orphans(children)
