"""A dead forkserver stops the run, named once, with its checkpoint (real processes, real signals).

Under the forkserver start method every sampler (and the inference worker) is a child of the
forkserver and its exit code comes through it: a SIGKILL of the forkserver makes all of them read
as dead with exit code 255 at once. That is one fault, named as the forkserver, and it is not
recovered: no restart of the budget is spent, no forkserver is started again, and nothing the dead
one forked is left running."""

from __future__ import annotations

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
import torch

from benchmarks.procfs import descendants
from fastlight.envs.registry import make_env
from fastlight.fleet.base import FleetBuild
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.pool import SamplerError, SamplerPool
from fastlight.fleet.start import PRELOAD, forkserver_pid
from fastlight.inference.settings import InferenceSettings
from fastlight.modules.rl_module import RLModule
from fastlight.procs import alive, children_ignore_stop_signals, parent_pid
from fastlight.rollout import Rollout
from fastlight.sampling.bundle import SamplerConfig
from fastlight.sampling.obs import obs_to_tensor, stack_obs
from tests.faults.test_cli_faults import assert_no_orphans, child_env, command, last_line, wait_for_training

pytestmark = [pytest.mark.multiproc]
ENV = "tests.fake_envs:FixedLength-v0"
INFERENCE = InferenceSettings(max_batch=64, max_wait_ms=1.0, sync_bucket_mb=1.0, sync_timeout_s=30.0)


@pytest.fixture
def preloading_forkserver() -> Iterator[None]:
    """The forkserver preloads the samplers' modules, as the ``fastlight`` command's does (the
    setting is the process's; it is put back after). The test kills it: a new one is started after,
    ignoring the stop signals as the command's does, for the tests that follow in this process."""
    context = multiprocessing.get_context("forkserver")
    before = list(forkserver._forkserver._preload_modules)
    context.set_forkserver_preload(PRELOAD)
    yield
    with children_ignore_stop_signals():
        forkserver.ensure_running()  # reaps the dead one
    context.set_forkserver_preload(before)


def make_pool(samplers: int, inference: bool) -> tuple[SamplerPool, torch.nn.Module]:
    module = RLModule(obs_dim=3, action_dim=2)
    module.configure_model()
    configs = [SamplerConfig(env_id=ENV, num_envs=1, max_horizon=4, seed=1000 * w) for w in range(samplers)]
    faults = FaultSettings(worker_timeout_s=120.0, max_worker_restarts=3)
    example = obs_to_tensor(stack_obs([make_env(ENV).reset(seed=0)[0]])) if inference else None
    pool = SamplerPool(
        FleetBuild(configs, module.policy, faults=faults, start_method="forkserver",
        inference=INFERENCE if inference else None, example_obs=example)
    )  # fmt: skip
    return pool, module.policy


def drive(pool: SamplerPool, done: Callable[[Rollout | None], bool], timeout: float = 120.0) -> None:
    """``pool.next_item`` from a thread, as the DataModule's prefetcher calls it (faults are seen
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


def counting(n: int) -> Callable[[Rollout | None], bool]:
    """Done once ``n`` items arrived."""
    seen = [0]

    def done(item: Rollout | None) -> bool:
        seen[0] += item is not None
        return seen[0] >= n

    return done


def wait_gone(pids: set[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("inference", [False, True], ids=["samplers", "inference_worker"])
def test_a_killed_forkserver_stops_the_pool_naming_it_once_and_restarts_nothing(
    capfd, preloading_forkserver, inference
):
    pool, policy = make_pool(4, inference)
    pool.start()
    try:
        pool.publish(policy, 0)
        drive(pool, counting(4))
        server = forkserver_pid()
        pids = [p.pid for p in pool.procs]
        forked = set(pids) | ({pool.client.proc.pid} if inference else set())
        assert server is not None and {parent_pid(p) for p in forked} == {server}
        capfd.readouterr()

        os.kill(server, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(SamplerError) as info:
            drive(pool, lambda _: False)
        assert time.monotonic() - t0 < 10.0  # seen at the next watch (0.25 s), plus 1 s for the 255s
        worker = f"the inference worker (pid {pool.client.proc.pid}) and " if inference else ""
        assert str(info.value) == (
            f"the forkserver (pid {server}) died, and with it {worker}the 4 samplers it forked (pids "
            f"{', '.join(map(str, pids))}); a dead forkserver is not restarted"
        )
        # No recovery: nothing spent from the budget, nothing said, no forkserver started again.
        assert (pool.restarts, pool.dropped_rollouts) == (0, 0)
        assert "fastlight:" not in capfd.readouterr().err
        assert forkserver_pid() == server and not alive(server)
        # A later watch (the DataModule's stop goes through it) restarts nothing either.
        with pytest.raises(SamplerError):
            pool.watch(force=True)
        assert pool.restarts == 0 and [p.pid for p in pool.procs] == pids
    finally:
        pool.stop()
    assert wait_gone(forked) == []
    assert forkserver_pid() == server  # the stop started no forkserver


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
def test_fit_stops_with_its_checkpoint_and_one_line_naming_a_killed_forkserver(tmp_path):
    """A real ``fastlight fit`` (the command's entry, which warms the forkserver) with 4 samplers:
    SIGKILL the forkserver -> exit 1 within a minute, one line naming the forkserver, the stop line
    last with a checkpoint that loads, no restart, and no process left."""
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
        rc = proc.wait(timeout=120)
        seconds = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert rc == 1, text[-3000:]
    assert seconds < 60, seconds
    named = [line for line in text.splitlines() if f"forkserver (pid {server})" in line]
    assert len(named) == 1, named
    assert re.search(
        rf"the forkserver \(pid {server}\) died, and with it the 4 samplers it forked \(pids "
        r"\d+, \d+, \d+, \d+\); a dead forkserver is not restarted($|; )",  # the stop line may go on
        named[0],
    ), named[0]
    assert "restarting" not in text, text[-3000:]
    stop = last_line(log)
    assert stop.startswith("fastlight: stopped by SamplerError at global step "), stop
    step = int(re.search(r"at global step (\d+)[:;] ", stop).group(1))
    assert "checkpoint saved to " in stop, stop
    assert step >= 2  # wait_for_training saw updates logged before the kill
    ckpt = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == step
    assert_no_orphans(children | {server})
