"""A sampler killed by SIGKILL (what the kernel's OOM killer sends) is reported with the memory it
held: a real sampler process holds a known amount of memory, is SIGKILLed, and the pool's error names
exit code -9, the OOM killer, ``dmesg`` and that memory (read by the pool while it watched)."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from fastlight.fleet.base import FleetBuild
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.pool import SamplerError, SamplerPool
from fastlight.models.mlp import MLPActorCritic
from fastlight.procs import exit_note, sample_memory
from fastlight.sampling.bundle import SamplerConfig
from tests.lightning_helpers import wait_no_children

HOG = "tests.sampling.error_envs:MemoryHog-v0"
HOLD_MIB = 400


@pytest.mark.multiproc
def test_a_sigkilled_sampler_is_named_with_its_memory_and_the_oom_hint(tmp_path):
    # Sampler 0 holds HOLD_MIB more than sampler 1, which runs the same env holding nothing.
    configs = [
        SamplerConfig(env_id=HOG, num_envs=1, max_horizon=4, seed=w,
                      env_kwargs={"hold_mib": HOLD_MIB if w == 0 else 0, "ready_dir": str(tmp_path)})
        for w in range(2)
    ]  # fmt: skip
    net = MLPActorCritic(3, 2)
    pool = SamplerPool(
        FleetBuild(configs, net, faults=FaultSettings(worker_timeout_s=60, max_worker_restarts=0))
    )
    pool.start()
    try:
        pool.publish(net, 0)
        hog, other = (p.pid for p in pool.procs)
        deadline = time.monotonic() + 60
        while not all((tmp_path / str(pid)).exists() for pid in (hog, other)):
            assert time.monotonic() < deadline, "the samplers did not reset their envs"
            pool.next_item(0.1)
        for _ in range(4):  # a few watches (every 0.25 s) after the memory was taken
            pool.next_item(0.2)
        held = sample_memory(hog).rss_mib - sample_memory(other).rss_mib
        assert abs(held - HOLD_MIB) < 0.1 * HOLD_MIB, held  # what the env holds is what the process holds
        os.kill(hog, signal.SIGKILL)
        with pytest.raises(SamplerError) as e:
            while time.monotonic() < deadline:
                pool.next_item(0.2)
        rss_other = sample_memory(other).rss_mib
    finally:
        pool.stop()
    line = str(e.value)
    assert "\n" not in line
    found = re.search(
        rf"^sampler 0 \(fastlight-sampler-0, pid {hog}, env {HOG}\) died with exit code -9; restart budget "
        r"exhausted: .*; exit code -9 is SIGKILL, which the kernel's OOM killer sends when memory runs out: "
        r"it held (\d+) MiB resident \(peak (\d+) MiB\) (\d+\.\d) s before; "
        r"`dmesg \| grep -i 'killed process'`",
        line,
    )
    assert found, line
    rss, peak, age = int(found[1]), int(found[2]), float(found[3])
    assert abs((rss - rss_other) - HOLD_MIB) < 0.15 * HOLD_MIB, (rss, rss_other)
    assert peak >= rss and age < 30
    wait_no_children()


def test_exit_notes_name_the_signal_and_only_sigkill_gets_the_memory():
    assert exit_note(0) is None and exit_note(3) is None and exit_note(None) is None
    assert exit_note(-11) == "exit code -11 is SIGSEGV"
    assert "its memory was never read" in exit_note(-9)
    big = sample_memory(os.getpid())
    assert big is not None and big.peak_mib >= big.rss_mib > 0
    assert re.search(
        r"it held [\d.]+ [MG]iB resident \(peak [\d.]+ [MG]iB\) 2\.0 s before", exit_note(-9, big, big.at + 2)
    )
