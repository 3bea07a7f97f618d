"""Inference-worker restarts with real processes and signals: a SIGKILLed inference worker is
restarted with the rank's samplers, on the weights last published (the same policy version, no new
publish needed), counted, within a time bound; a SIGSTOPped one is caught by its heartbeat; past
the budget the pool stops with an error naming the inference worker, its pid, exit code and env
id. No child and no shared-memory file survives the pool."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from fastlight.envs.registry import make_env
from fastlight.fleet.base import FleetBuild
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.pool import SamplerError, SamplerPool
from fastlight.inference.settings import InferenceSettings
from fastlight.sampling.bundle import SamplerConfig
from fastlight.sampling.obs import obs_to_tensor, stack_obs
from tests.faults.test_worker_restarts import items_of, policy, until_restarted
from tests.lightning_helpers import wait_no_children

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
ENV = "tests.fake_envs:FixedLength-v0"
INFERENCE = InferenceSettings(max_batch=64, max_wait_ms=1.0, sync_bucket_mb=1.0, sync_timeout_s=30.0)


def shm_files(pids: set[int]) -> set[str]:
    """/dev/shm entries named after one of ``pids`` (torch's ``torch_<pid>_...`` files)."""
    return {n for n in os.listdir("/dev/shm") if any(f"_{p}_" in n for p in pids)}


def served_pool(max_restarts: int, heartbeat_s: float = 60.0) -> tuple[SamplerPool, torch.nn.Module]:
    configs = [SamplerConfig(env_id=ENV, num_envs=2, max_horizon=4, seed=1000 * w) for w in range(2)]
    example = obs_to_tensor(stack_obs([make_env(ENV).reset(seed=0)[0]]))
    net = policy()
    pool = SamplerPool(
        FleetBuild(configs, net, inference=INFERENCE, example_obs=example,
        faults=FaultSettings(worker_timeout_s=120.0, max_worker_restarts=max_restarts,
                             heartbeat_s=heartbeat_s))
    )  # fmt: skip
    return pool, net


def test_killed_and_stopped_inference_worker_restart_then_the_budget_stops_naming_it(capfd):
    pool, net = served_pool(max_restarts=2, heartbeat_s=3.0)
    pids: set[int] = {os.getpid()}
    pool.start()
    try:
        assert pool.client is not None
        pool.publish(net, 0)
        assert items_of(pool, 0, 2) == [0, 0]
        worker = pool.client.proc.pid
        samplers = [p.pid for p in pool.procs]
        pids |= {worker, *samplers}

        # SIGKILL: the worker and both samplers are replaced; the new worker serves version 0
        # without a new publish (it took the current weights from the shared double buffer).
        os.kill(worker, signal.SIGKILL)
        seconds = until_restarted(pool, 1)
        assert pool.restarts == 1 and pool.dropped_rollouts == 2  # both samplers' rounds in flight
        assert pool.client.proc.pid != worker
        assert not {p.pid for p in pool.procs} & set(samplers)
        assert all(not os.path.exists(f"/proc/{p}") for p in (worker, *samplers))  # reaped
        t_items = time.monotonic()
        assert items_of(pool, 0, 2) == [0, 0]
        recovery = seconds + time.monotonic() - t_items
        assert recovery < 30.0, recovery  # restart seen at the next watch (0.25 s) + spawn + imports
        pool.publish(net, 1)  # and the new worker takes later publishes
        assert items_of(pool, 1, 2) == [1, 1]

        # SIGSTOP: alive but silent; its heartbeat (3 s) stands still and the group is restarted.
        stopped = pool.client.proc.pid
        pids |= {stopped, *(p.pid for p in pool.procs)}
        os.kill(stopped, signal.SIGSTOP)
        seconds = until_restarted(pool, 2)
        assert 3.0 <= seconds < 3.0 + 10.0, seconds  # the bound plus a loaded machine's slack
        assert not os.path.exists(f"/proc/{stopped}")  # killed and reaped, not left stopped
        # Its samplers, waiting on its answers, keep beating: the worker is the one named.
        said = capfd.readouterr().err
        assert re.search(
            rf"inference worker \(fastlight-inference, pid {stopped}, env {re.escape(ENV)}\) "
            r"made no progress for \d+\.\d s \(--data.faults.heartbeat_s 3\)",
            said,
        ), said
        assert not re.search(r"sampler \d+ \([^)]*\) made no progress", said), said
        assert items_of(pool, 1, 2) == [1, 1]
        assert pool.restarts == 2 and pool.dropped_rollouts == 4

        # A third fault within the window is past the budget: a named error.
        victim = pool.client.proc.pid
        pids |= {victim, *(p.pid for p in pool.procs)}
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(SamplerError) as info:
            until_restarted(pool, 3)
        msg = str(info.value)
        assert re.search(
            rf"inference worker \(fastlight-inference, pid {victim}, env {re.escape(ENV)}\) died with exit "
            r"code -9; restart budget exhausted: 2 restarts in the last 600 s "
            r"\(--data.faults.max_worker_restarts 2 per --data.faults.restart_window_s 600\)",
            msg,
        ), msg
    finally:
        pool.stop()
    wait_no_children()
    assert shm_files(pids) == set()


def test_inference_worker_killed_during_a_publish_is_restarted_and_the_publish_lands():
    pool, net = served_pool(max_restarts=1)
    pool.start()
    try:
        assert pool.client is not None
        pool.publish(net, 0)
        assert items_of(pool, 0, 2) == [0, 0]
        worker = pool.client.proc
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(timeout=10.0)  # dead before the publish: its check sees it, not the watch
        pool.publish(net, 1)
        assert pool.restarts == 1 and pool.client.proc.pid != worker.pid
        assert items_of(pool, 1, 2) == [1, 1]
    finally:
        pool.stop()
    wait_no_children()
    assert not Path(f"/proc/{worker.pid}").exists()


def test_a_killed_sampler_is_named_not_the_inference_worker_its_death_ends(capfd):
    """The worker, its pipe to the sampler closed, exits (code 1) right after the sampler: the restart
    line names the sampler and its signal, and the worker prints no traceback of the closed pipe."""
    pool, net = served_pool(max_restarts=3)
    pool.start()
    try:
        assert pool.client is not None
        pool.publish(net, 0)
        assert items_of(pool, 0, 2) == [0, 0]
        worker, victim = pool.client.proc.pid, pool.procs[0].pid
        capfd.readouterr()
        os.kill(victim, signal.SIGKILL)
        # Both dead before the pool looks (a forked worker exits within milliseconds of the EOF).
        pool.procs[0].join(10)
        pool.client.proc.join(10)
        assert (pool.procs[0].exitcode, pool.client.proc.exitcode) == (-9, 1)
        until_restarted(pool, 1)
        assert pool.restarts == 1 and pool.dropped_rollouts == 2
        assert items_of(pool, 0, 2) == [0, 0]
        said = capfd.readouterr().err
        assert re.search(
            rf"fastlight: sampler 0 \(fastlight-sampler-0, pid {victim}, env {re.escape(ENV)}\) died with "
            r"exit code -9; restarting the inference worker and its 2 samplers",
            said,
        ), said
        assert f"pid {worker}" not in said and "Traceback" not in said and "EOFError" not in said, said
    finally:
        pool.stop()
    wait_no_children()
