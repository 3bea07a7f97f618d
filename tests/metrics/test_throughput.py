"""FAST's throughput family: arithmetic on a hand-built Rollout, clocks, and DDP reduction."""

from __future__ import annotations

import math
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastlight.metrics.throughput import METRIC_KEYS, ThroughputMetrics
from fastlight.rollout import EpisodeRecord, Rollout, RolloutStats


def _hand_built_rollout() -> Rollout:
    """T=4, E=2 DPSA cycle. Env 0 crashes after 2 steps, then 2 dummy steps; env 1 runs 4 steps
    and is cut by the unified truncation. 8 slots, 6 valid."""
    valid = torch.tensor([[1, 1], [1, 1], [0, 1], [0, 1]], dtype=torch.bool)
    terminated = torch.tensor([[0, 0], [1, 0], [0, 0], [0, 0]], dtype=torch.bool)
    truncated = torch.tensor([[0, 0], [0, 0], [0, 0], [0, 1]], dtype=torch.bool)
    zeros = torch.zeros(4, 2)
    longs = torch.zeros(4, 2, dtype=torch.long)
    stats = RolloutStats(
        raw_steps=valid.numel(),
        valid_steps=int(valid.sum()),
        step_time=1.5,
        reset_time=0.3,
        wall_time=2.0,
        global_resets=1,
        episodes=[
            EpisodeRecord(length=2, ret=-1.0, terminated=True, truncated=False, crashed=True),
            EpisodeRecord(length=4, ret=4.0, terminated=False, truncated=True, cut=True),
        ],
    )
    return Rollout(
        obs=torch.zeros(4, 2, 3), actions=longs, logprobs=zeros, values=zeros, rewards=zeros,
        terminated=terminated, truncated=truncated, valid=valid, step=longs, task_id=longs,
        policy_version=longs, bootstrap_values=zeros, stats=stats,
    ).validate()


def _values(metric: ThroughputMetrics) -> dict[str, float]:
    return {k: float(v) for k, v in metric.compute().items()}


def test_each_metric_on_a_hand_built_rollout() -> None:
    metric = ThroughputMetrics()
    metric.update(_hand_built_rollout().stats)
    out = _values(metric)
    assert set(out) == set(METRIC_KEYS)
    assert out["raw_tps"] == pytest.approx(8 / 2.0)  # dummy steps included
    assert out["effective_tps"] == pytest.approx(6 / 2.0)
    assert out["sample_efficiency"] == pytest.approx(6 / 8)
    assert out["time_efficiency"] == pytest.approx(1.5 / 2.0)
    assert out["per_sampler_tps"] == pytest.approx(6 / 2.0)
    assert out["mean_episode_length"] == pytest.approx((2 + 4) / 2)  # the cut one at its cut length
    assert out["resets_per_1k_valid"] == pytest.approx(1000 * 1 / 6)
    assert out["truncated_episode_share"] == pytest.approx(0.5)
    assert out["time_limit_share"] == 0.0
    assert out["effective_tps"] == pytest.approx(out["raw_tps"] * out["sample_efficiency"])


def test_counts_accumulate_and_elapsed_overrides_the_rate_clock() -> None:
    stats = _hand_built_rollout().stats
    merged = stats.merge(stats)  # two parallel workers: wall_time adds up to 4 s
    metric = ThroughputMetrics()
    metric.update(merged, elapsed=2.0)  # ... but they ran side by side for 2 s
    out = _values(metric)
    assert out["effective_tps"] == pytest.approx(12 / 2.0)  # whole-job rate
    assert out["per_sampler_tps"] == pytest.approx(12 / 4.0)  # one sampler's rate
    assert out["time_efficiency"] == pytest.approx(3.0 / 4.0)
    metric.update(stats)  # default clock: the sampler's own wall time
    assert float(metric.elapsed) == pytest.approx(4.0)
    assert _values(metric)["raw_tps"] == pytest.approx(24 / 4.0)


def test_undefined_ratios_are_nan_not_zero() -> None:
    metric = ThroughputMetrics()
    metric.update(RolloutStats(raw_steps=4, valid_steps=4, step_time=0.5, wall_time=1.0))
    out = _values(metric)
    assert math.isnan(out["mean_episode_length"]) and math.isnan(out["truncated_episode_share"])
    assert out["effective_tps"] == pytest.approx(4.0)
    assert out["resets_per_1k_valid"] == 0.0


def test_forward_accumulates_elapsed_by_sum() -> None:
    # forward's batch-local fast path would max-reduce ``elapsed``; full_state_update avoids it.
    stats = _hand_built_rollout().stats
    metric = ThroughputMetrics()
    batch = metric(stats)
    assert float(batch["effective_tps"]) == pytest.approx(3.0)
    metric(stats)
    assert float(metric.elapsed) == pytest.approx(4.0)
    assert float(metric.compute()["effective_tps"]) == pytest.approx(3.0)


def test_the_truncated_share_counts_unified_truncations_only() -> None:
    """The env's own time limit is not a cut a DPSA setting makes: it is its own share (issue 39: the
    truncated share stayed at 0.51 while auto's cuts fell from 0.39 to 0.06)."""
    metric = ThroughputMetrics()
    episodes = [
        EpisodeRecord(length=9, ret=0.0, terminated=False, truncated=True, cut=True),  # a unified truncation
        EpisodeRecord(length=200, ret=0.0, terminated=False, truncated=True),  # the env's time limit
        EpisodeRecord(length=200, ret=0.0, terminated=False, truncated=True),
        EpisodeRecord(length=3, ret=0.0, terminated=True, truncated=False),
    ]
    metric.update(RolloutStats(raw_steps=1, valid_steps=1, wall_time=1.0, episodes=episodes))
    out = _values(metric)
    assert out["truncated_episode_share"] == pytest.approx(1 / 4)
    assert out["time_limit_share"] == pytest.approx(2 / 4)


def test_bad_inputs_raise() -> None:
    metric = ThroughputMetrics()
    with pytest.raises(TypeError, match="RolloutStats"):
        metric.update({"raw_steps": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="elapsed"):
        metric.update(RolloutStats(), elapsed=-1.0)


# ---------------------------------------------------------------------------------------- DDP
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: Per-rank (stats, elapsed): rank 1 sampled more, for longer.
RANK_STATS = [
    (RolloutStats(raw_steps=10, valid_steps=8, step_time=1.0, wall_time=2.0, global_resets=1,
                  episodes=[EpisodeRecord(length=8, ret=0.0, terminated=True, truncated=False)]), 2.0),
    (RolloutStats(raw_steps=30, valid_steps=24, step_time=2.0, wall_time=3.0, global_resets=2,
                  episodes=[EpisodeRecord(length=4, ret=0.0, terminated=False, truncated=True,
                                          cut=True)] * 3), 3.0),
]


def _ddp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    try:
        metric = ThroughputMetrics()
        stats, elapsed = RANK_STATS[rank]
        metric.update(stats, elapsed=elapsed)
        out = {k: float(v) for k, v in metric.compute().items()}
        torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.multiproc
@pytest.mark.ranks
def test_two_gloo_ranks_report_whole_job_figures(tmp_path: Path) -> None:
    ctx = mp.start_processes(
        _ddp_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 60
    try:
        while not ctx.join(timeout=1):  # raises with the child's traceback if a rank fails
            if time.monotonic() > deadline:
                pytest.fail("gloo ranks did not finish within 60 s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
    for rank in range(2):
        out = torch.load(tmp_path / f"rank{rank}.pt")
        assert out["raw_tps"] == pytest.approx(40 / 3.0)  # Σ counts / max clock
        assert out["effective_tps"] == pytest.approx(32 / 3.0)
        assert out["sample_efficiency"] == pytest.approx(32 / 40)
        assert out["time_efficiency"] == pytest.approx(3.0 / 5.0)
        assert out["per_sampler_tps"] == pytest.approx(32 / 5.0)
        assert out["mean_episode_length"] == pytest.approx((8 + 3 * 4) / 4)
        assert out["resets_per_1k_valid"] == pytest.approx(1000 * 3 / 32)
        assert out["truncated_episode_share"] == pytest.approx(3 / 4)
