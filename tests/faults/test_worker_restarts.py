"""Sampler restarts with real processes and signals: a SIGKILLed sampler and a SIGSTOPped one are
restarted on the current weights and counted, a third fault past the budget stops with an error
naming sampler, pid, exit code and env id, and no child survives the pool."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from benchmarks.procfs import descendants, spawned_descendants
from fastlight.fleet.base import FleetBuild
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.pool import SamplerError, SamplerPool
from fastlight.modules.rl_module import RLModule
from fastlight.sampling.bundle import SamplerConfig
from tests.lightning_helpers import wait_no_children

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
ENV = "tests.fake_envs:FixedLength-v0"


def policy():
    module = RLModule(obs_dim=3, action_dim=2)
    module.configure_model()
    return module.policy


def items_of(pool: SamplerPool, version: int, n: int, timeout: float = 60.0) -> list[int]:
    """Sampler items until ``n`` of ``version`` arrived (older ones are skipped); their versions."""
    got: list[int] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {got} of version {version} within {timeout} s"
        item = pool.next_item(0.2)
        if item is not None and int(item.policy_version.max()) == version:
            got.append(version)
    return got


def until_restarted(pool: SamplerPool, restarts: int, timeout: float = 60.0) -> float:
    t0 = time.monotonic()
    while pool.restarts < restarts:
        assert time.monotonic() - t0 < timeout, "no restart within the timeout"
        pool.next_item(0.2)
    return time.monotonic() - t0


def test_killed_and_stopped_samplers_restart_then_the_budget_stops_naming_the_sampler(capfd):
    configs = [SamplerConfig(env_id=ENV, num_envs=1, max_horizon=4, seed=1000 * w) for w in range(2)]
    net = policy()
    faults = FaultSettings(worker_timeout_s=120.0, max_worker_restarts=2, heartbeat_s=2.0)
    pool = SamplerPool(FleetBuild(configs, net, faults=faults))
    pool.start()
    try:
        pool.publish(net, 0)
        assert items_of(pool, 0, 2) == [0, 0]
        pids = [p.pid for p in pool.procs]

        # SIGKILL: restarted, counted, and the run goes on with the same policy version.
        os.kill(pids[0], signal.SIGKILL)
        seconds = until_restarted(pool, 1)
        assert seconds < 10, seconds  # the exit code is seen at the next watch (0.25 s)
        assert pool.procs[0].pid != pids[0] and pool.procs[1].pid == pids[1]
        assert pool.dropped_rollouts == 1
        pool.publish(net, 1)
        assert items_of(pool, 1, 2) == [1, 1]  # both samplers, the new one included, serve version 1

        # SIGSTOP: alive but silent; caught by the heartbeat (2 s) and restarted.
        os.kill(pids[1], signal.SIGSTOP)
        seconds = until_restarted(pool, 2)
        assert 2.0 <= seconds < 2.0 + 8.0, seconds  # the bound, plus a loaded machine's slack
        assert not os.path.exists(f"/proc/{pids[1]}")  # killed and reaped, not left stopped
        said = capfd.readouterr().err
        assert re.search(
            rf"fastlight: sampler 1 \(fastlight-sampler-1, pid {pids[1]}, env {re.escape(ENV)}\) made no "
            r"progress for \d+\.\d s \(--data.faults.heartbeat_s 2\); killed it \(exit code -9\); restarting",
            said,
        ), said
        pool.publish(net, 2)
        assert items_of(pool, 2, 2) == [2, 2]
        assert pool.restarts == 2 and pool.dropped_rollouts == 2

        # A third fault within the window is past the budget: a named error.
        victim = pool.procs[0].pid
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(SamplerError) as info:
            until_restarted(pool, 3)
        msg = str(info.value)
        assert re.search(
            rf"sampler 0 \(fastlight-sampler-0, pid {victim}, env {re.escape(ENV)}\) died with exit code -9; "
            r"restart budget exhausted: 2 restarts in the last 600 s "
            r"\(--data.faults.max_worker_restarts 2 per --data.faults.restart_window_s 600\)",
            msg,
        ), msg
    finally:
        pool.stop()
    wait_no_children()


def test_a_stop_during_a_restart_waits_for_it_and_nothing_restarts_after(capfd, monkeypatch):
    """The stop (the trainer's thread) comes while a restart (the prefetch thread's) is spawning: it
    waits for the restart, stops what it started, and no restart begins after it."""
    configs = [SamplerConfig(env_id=ENV, num_envs=1, max_horizon=4, seed=1000 * w) for w in range(2)]
    net = policy()
    pool = SamplerPool(
        FleetBuild(configs, net, faults=FaultSettings(worker_timeout_s=120.0, max_worker_restarts=3))
    )
    pool.start()
    pool.publish(net, 0)
    assert items_of(pool, 0, 2) == [0, 0]
    real_spawn = SamplerPool._spawn
    restarting = threading.Event()

    def slow_spawn(self: SamplerPool, i: int):  # a restart's spawn, slow: the stop comes during it
        restarting.set()
        time.sleep(1.0)
        return real_spawn(self, i)

    monkeypatch.setattr(SamplerPool, "_spawn", slow_spawn)
    victim = pool.procs[0].pid
    capfd.readouterr()
    os.kill(victim, signal.SIGKILL)

    def prefetch() -> None:  # as the DataModule's prefetcher, until the stop
        while not pool.stopping:
            pool.next_item(0.2)

    watcher = threading.Thread(target=prefetch, daemon=True)
    watcher.start()
    assert restarting.wait(30), "the killed sampler was not seen"
    pool.stop()
    said = capfd.readouterr().err
    watcher.join(10)
    time.sleep(1.5)  # a restart that outlived the stop would say something by now
    lines = [line for line in said.splitlines() if line.startswith("fastlight:")]
    assert len(lines) == 1 and f"pid {victim}, env" in lines[0] and "restarting it" in lines[0], said
    assert "fastlight:" not in capfd.readouterr().err
    assert pool.restarts == 1 and pool.samplers == []
    wait_no_children()  # what the restart started (under the stop's wait) is stopped too
    pool.watch(force=True)  # and a watch after the stop restarts nothing
    assert pool.restarts == 1 and pool.samplers == []


def test_fit_restarts_a_killed_sampler_and_stops_named_when_the_budget_is_spent(tmp_path):
    """A real ``fastlight fit``: SIGKILL one sampler -> restarted, training goes on and the counters
    are logged; SIGKILL the next one with the budget (1) spent -> exit 1 naming it, a checkpoint."""
    from tests.faults.test_cli_faults import assert_no_orphans, last_line, start, wait_for_training

    root = tmp_path / "run"
    proc, log = start(root, "--data.faults.max_worker_restarts", "1")
    wait_for_training(proc, root)
    children = descendants(proc.pid)
    first = spawned_descendants(proc.pid)[0]
    t0 = time.monotonic()
    os.kill(first, signal.SIGKILL)
    metrics = root / "csv" / "version_0" / "metrics.csv"
    while "restarting it" not in log.read_text():
        assert proc.poll() is None and time.monotonic() - t0 < 60, log.read_text()[-3000:]
        time.sleep(0.2)
    rows = len(metrics.read_text().splitlines())
    while len(metrics.read_text().splitlines()) <= rows:  # an update after the restart
        assert proc.poll() is None and time.monotonic() - t0 < 120, log.read_text()[-3000:]
        time.sleep(0.2)
    assert time.monotonic() - t0 < 120
    named = f"pid {first}, env tests.fake_envs:Fault-v0) died with exit code -9; restarting it"
    assert named in log.read_text()
    header = metrics.read_text().splitlines()[0].split(",")
    assert "faults/worker_restarts" in header and "faults/dropped_rollouts" in header
    children |= descendants(proc.pid)
    second = spawned_descendants(proc.pid)[0]
    os.kill(second, signal.SIGKILL)
    rc = proc.wait(timeout=120)
    text = log.read_text()
    assert rc == 1, text[-3000:]
    assert re.search(
        rf"pid {second}, env tests.fake_envs:Fault-v0\) died with exit code -9; restart budget "
        r"exhausted: 1 restarts in the last 600 s",
        text,
    ), text[-3000:]
    assert last_line(log).startswith("fastlight: stopped by SamplerError at global step ")
    assert_no_orphans(children)
    import torch

    ckpt = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] > 0
