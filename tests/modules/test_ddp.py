"""Multi-rank training through Lightning's own DDP strategy (gloo on CPU), end to end."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
import torch

from fastlight.rank_state import PER_RANK_KEY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_ddp(tmp_path, config: str, *extra: str, strategy: str = "ddp") -> list[dict]:
    out = tmp_path / "ranks"
    cmd = [
        sys.executable,
        "-m",
        "fastlight",  # the command's own entry: it warms a forkserver in each rank, as users run it
        "fit",
        "--config",
        os.path.join(ROOT, config),
        "--trainer.strategy",
        strategy,
        "--trainer.devices",
        "2",
        "--trainer.accelerator",
        "cpu",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.callbacks+",
        "tests.modules.ddp_probe.DumpRankState",
        "--trainer.callbacks.out_dir",
        str(out),
        *extra,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.multiproc
@pytest.mark.ranks
def test_two_rank_ddp_keeps_models_identical(tmp_path):
    ranks = run_ddp(
        tmp_path,
        "examples/merge.yaml",
        "--data.env_id",
        "highway-fast-v0",
        "--data.num_envs",
        "2",
        "--data.num_workers",
        "1",
        "--data.max_horizon",
        "6",
        "--trainer.max_steps",
        str(2 * 4 * 4),  # 2 updates of 4x4 minibatches
        "--trainer.callbacks+",
        "fastlight.RolloutThroughput",
    )
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert [r["version"] for r in ranks] == [2, 2]
    # Gradients were averaged by DDP: both ranks hold bit-identical weights after the updates ...
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    # ... although each rank sampled its own data (seeds offset by rank).
    assert ranks[0]["seeds"] != ranks[1]["seeds"]
    # The throughput totals in the checkpoint and the last logged ones are the job's: the sum of the
    # ranks' own (they used to be rank 0's alone), and equal to env_steps (summed over ranks as it goes).
    own = [r["throughput_totals"][0] for r in ranks]
    assert all(o["valid_steps"] > 0 and o["raw_steps"] >= o["valid_steps"] for o in own)
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    saved = ckpt["callbacks"]["fastlight.RolloutThroughput"]
    assert saved[PER_RANK_KEY] == own
    assert saved["totals"] == {k: own[0][k] + own[1][k] for k in own[0]}
    assert saved["totals"]["valid_steps"] == ckpt["callbacks"]["fastlight.EnvStepBudget"]["env_steps"]
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("perf/valid_steps_total")]
    assert float(rows[-1]["perf/valid_steps_total"]) == saved["totals"]["valid_steps"]
    assert float(rows[-1]["perf/raw_steps_total"]) == saved["totals"]["raw_steps"]


@pytest.mark.slow  # 45 s on 2 cores (two ranks, each with MT10 samplers); DDP itself is covered above
@pytest.mark.multiproc
def test_two_rank_ddp_on_mt10_state_only_with_dwr_pooled(tmp_path):
    ranks = run_ddp(
        tmp_path,
        "configs/vla_metaworld_mt10.yaml",
        "--model.init_from",  # the config starts from an SFT run's checkpoint; here from scratch
        "null",
        "--data.env_kwargs",
        "{tasks: MT10, image: false, max_path_length: 6}",
        "--data.num_envs",
        "2",
        "--data.num_workers",
        "1",
        "--data.max_horizon",
        "6",
        "--data.cycles_per_step",
        "2",
        "--model.sil_steps",  # self-imitation steps would count in max_steps once a success appears
        "0",
        "--trainer.max_steps",
        str(2 * 2 * 2),  # 2 updates of 2x2 minibatches
        # State-only: the VLA's image encoder gets no input, hence no gradient.
        strategy="ddp_find_unused_parameters_true",
    )
    assert [r["version"] for r in ranks] == [2, 2]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    # DWR statistics are pooled over ranks: both hold the same windows and weights.
    assert ranks[0]["dwr_weights"] == ranks[1]["dwr_weights"] and ranks[0]["dwr_weights"]
    assert ranks[0]["dwr_outcomes"] == ranks[1]["dwr_outcomes"] and ranks[0]["dwr_outcomes"][0] > 0


@pytest.mark.multiproc
@pytest.mark.ranks
def test_periodic_evaluation_under_ddp_agrees_on_every_rank(tmp_path):
    """Rank 0 plays, every rank logs the same numbers and takes part in best.ckpt's save."""
    ranks = run_ddp(
        tmp_path, "configs/highway_dpsa.yaml",
        "--data.num_envs", "2", "--data.num_workers", "1", "--data.max_horizon", "6",
        "--model.update_epochs", "1", "--model.num_minibatches", "2", "--trainer.max_steps", "4",
        "--config", os.path.join(ROOT, "callbacks", "evaluation.yaml"),
        "--trainer.callbacks.every_updates", "1", "--trainer.callbacks.episodes", "2",
    )  # fmt: skip
    evals = [r["evaluations"][0] for r in ranks]
    assert [e["count"] for e in evals] == [2, 2]  # after each of the 2 updates
    assert evals[0] == evals[1] and evals[0]["last"]["eval/return"] == pytest.approx(
        evals[0]["last"]["eval/return"]
    )
    assert {"eval/return", "eval/length", "eval/crash_rate"} <= set(evals[0]["last"])
    best = torch.load(
        tmp_path / "checkpoints" / "version_0" / "best.ckpt", map_location="cpu", weights_only=True
    )
    assert best["global_step"] in (2, 4)
