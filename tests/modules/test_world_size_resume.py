"""Per-rank checkpoint state mapped onto another world size: counters summed, SIL buffers merged or split."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from fastlight.callbacks.throughput import RolloutThroughput
from fastlight.rank_state import PER_RANK_KEY, counters_for_rank, old_ranks_for, per_rank_entries
from fastlight.vla.self_imitation import SuccessBuffer, buffers_for_world_size
from tests.vla.test_self_imitation import one_success_rollout, sil_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_old_ranks_map_by_modulo():
    assert [old_ranks_for(r, 1, 2) for r in range(1)] == [[0, 1]]  # 2 -> 1: merged
    assert [old_ranks_for(r, 2, 1) for r in range(2)] == [[0], []]  # 1 -> 2: the new rank 1 starts empty
    assert [old_ranks_for(r, 2, 2) for r in range(2)] == [[0], [1]]  # same size: each its own
    assert [old_ranks_for(r, 2, 3) for r in range(2)] == [[0, 2], [1]]


def test_counters_keep_the_job_total_both_ways():
    two = [{"worker_restarts": 2, "dropped_rollouts": 1}, {"worker_restarts": 3}]
    assert counters_for_rank(two, 0, 1) == {"dropped_rollouts": 1, "worker_restarts": 5}
    one = [{"worker_restarts": 5, "dropped_rollouts": 1}]
    split = [counters_for_rank(one, r, 2) for r in range(2)]
    assert split == [
        {"dropped_rollouts": 1, "worker_restarts": 5},
        {"dropped_rollouts": 0, "worker_restarts": 0},
    ]
    # A checkpoint from before per-rank state: its own values are the only rank.
    assert per_rank_entries({"worker_restarts": 4}, {"worker_restarts": 4}) == [{"worker_restarts": 4}]


def test_throughput_totals_of_two_ranks_are_summed_on_one():
    saved = {"totals": {"raw_steps": 22, "valid_steps": 22}}
    saved[PER_RANK_KEY] = [{"raw_steps": 22, "valid_steps": 22}, {"raw_steps": 16, "valid_steps": 15}]
    cb = RolloutThroughput()
    cb.load_state_dict(saved)  # outside a process group: world size 1
    assert cb.totals["raw_steps"] == 38 and cb.totals["valid_steps"] == 37
    assert cb.totals["episodes"] == 0  # a key neither rank saved starts at 0


def _buffer(task_rows: dict[int, list[int]], *, episodes: int, capacity: int = 8) -> dict:
    buf = SuccessBuffer(capacity)
    for task, rows in task_rows.items():
        r = torch.tensor(rows, dtype=torch.float32)
        buf._append(task, {"obs": r[:, None], "actions": r.long()[:, None]})
    buf.episodes_added = episodes
    return buf.state_dict()


def _rows(state: dict, task: int) -> list[int]:
    return state["tasks"][task]["actions"][:, 0].tolist()


def test_two_rank_buffers_merge_onto_one():
    a = _buffer({0: [1, 2, 3], 1: [10]}, episodes=2)
    b = _buffer({0: [4, 5], 2: [20, 21]}, episodes=3)
    (one,) = buffers_for_world_size([a, b], 1, capacity=8)
    assert _rows(one, 0) == [1, 2, 3, 4, 5] and _rows(one, 1) == [10] and _rows(one, 2) == [20, 21]
    assert one["episodes_added"] == 5
    # Over capacity: each rank's newest steps, an equal share each (not only the last rank's).
    (small,) = buffers_for_world_size([a, b], 1, capacity=2)
    assert _rows(small, 0) == [3, 5]
    buf = SuccessBuffer(8)
    buf.load_state_dict(one)
    assert buf.steps_per_task() == {0: 5, 1: 1, 2: 2}


def test_one_rank_buffer_splits_evenly_onto_two():
    one = _buffer({0: [1, 2, 3, 4, 5], 1: [10]}, episodes=4)
    r0, r1 = buffers_for_world_size([one], 2, capacity=8)
    assert _rows(r0, 0) == [1, 3, 5] and _rows(r1, 0) == [2, 4]
    assert (
        _rows(r0, 1) == [10] and 1 not in r1["tasks"]
    )  # no empty task: sample() picks among tasks with steps
    assert (r0["episodes_added"], r1["episodes_added"]) == (4, 0)
    # Nothing lost or doubled: the two halves are the whole.
    assert sorted(_rows(r0, 0) + _rows(r1, 0)) == _rows(one, 0)
    # The same world size keeps each rank's own buffer exactly.
    assert buffers_for_world_size([r0, r1], 2, capacity=8) == [r0, r1]


def test_buffers_with_different_fields_are_refused_in_one_line():
    a = _buffer({0: [1]}, episodes=1)
    b = _buffer({0: [2]}, episodes=1)
    b["tasks"][0]["valid"] = torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(
        ValueError, match=r"^--ckpt_path: .* task 0 hold different fields .* onto 1 rank\(s\)$"
    ):
        buffers_for_world_size([a, b], 1, capacity=8)


def test_vla_checkpoint_carries_every_ranks_buffer_merged_on_one_split_on_two(monkeypatch):
    """VLAModule's hooks: the file holds each rank's buffer; one rank merges them, two split one."""
    import fastlight.vla.module as vla

    r = one_success_rollout()  # 12 successful steps of task 0
    rank0, rank1 = sil_module(sil_steps=2), sil_module(sil_steps=2)
    rank0.success_buffer.add_rollout(r)
    for _ in range(2):
        rank1.success_buffer.add_rollout(r)
    monkeypatch.setattr(vla, "gather_per_rank", lambda own: [own, rank1.success_buffer.state_dict()])
    checkpoint: dict = {}
    rank0.on_save_checkpoint(checkpoint)
    assert len(checkpoint[vla.SIL_CHECKPOINT_KEY][PER_RANK_KEY]) == 2

    def loaded(rank: int, size: int, ckpt: dict) -> SuccessBuffer:
        monkeypatch.setattr(vla, "world", lambda: (rank, size))
        m = sil_module(sil_steps=2)
        m.on_load_checkpoint({**ckpt, "state_dict": {}})
        return m.success_buffer

    one = loaded(0, 1, checkpoint)  # 2 ranks -> 1: merged, nothing lost under the capacity
    assert one.steps_per_task() == {0: 36} and one.episodes_added == 3
    assert [loaded(k, 2, checkpoint).steps_per_task() for k in range(2)] == [{0: 12}, {0: 24}]  # same size

    monkeypatch.setattr(vla, "gather_per_rank", lambda own: [own])
    single: dict = {}
    one_rank = sil_module(sil_steps=2)
    one_rank.success_buffer.load_state_dict(one.state_dict())
    one_rank.on_save_checkpoint(single)
    halves = [loaded(k, 2, single) for k in range(2)]  # 1 rank -> 2: split evenly
    assert [h.steps_per_task() for h in halves] == [{0: 18}, {0: 18}]
    assert [h.episodes_added for h in halves] == [3, 0]


def _fit(tmp_path, name: str, devices: int, max_steps: int, *extra: str) -> dict:
    """A tiny highway fit on ``devices`` CPU ranks; returns its ``last.ckpt`` and each rank's probe."""
    root, out = tmp_path / name, tmp_path / name / "ranks"
    cmd = [
        sys.executable,
        "-m",
        "fastlight",
        "fit",
        "--config",
        os.path.join(ROOT, "configs/highway_dpsa.yaml"),
    ]
    cmd += ["--trainer.strategy", "ddp"] if devices > 1 else []
    cmd += [
        "--trainer.devices",
        str(devices),
        "--trainer.accelerator",
        "cpu",
        "--trainer.max_steps",
        str(max_steps),
    ]
    cmd += ["--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root)]
    cmd += ["--data.num_envs", "2", "--data.num_workers", "1", "--data.max_horizon", "6"]
    cmd += [
        "--trainer.callbacks+",
        "tests.modules.ddp_probe.DumpRankState",
        "--trainer.callbacks.out_dir",
        str(out),
    ]
    proc = subprocess.run([*cmd, *extra], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ckpt = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(devices)]
    return {
        "ckpt": ckpt,
        "ranks": ranks,
        "stderr": proc.stderr,
        "path": str(root / "checkpoints" / "last.ckpt"),
    }


def _counts(ckpt: dict) -> tuple[int, int, list[int], int]:
    """(global step, policy version, valid steps per saved rank, env_steps)."""
    per_rank = ckpt["callbacks"]["fastlight.RolloutThroughput"][PER_RANK_KEY]
    version = int(ckpt["state_dict"]["_policy_version"])
    env_steps = ckpt["callbacks"]["fastlight.EnvStepBudget"]["env_steps"]
    return ckpt["global_step"], version, [t["valid_steps"] for t in per_rank], env_steps


@pytest.mark.slow  # three fits (2, 1, then 2 CPU ranks): about 2 minutes on 2 cores
@pytest.mark.multiproc
def test_resume_two_ranks_on_one_and_one_on_two(tmp_path):
    a = _fit(tmp_path, "two", 2, 4)  # one update of 16 optimizer steps (4 epochs x 4 minibatches)
    step_a, version_a, valid_a, env_a = _counts(a["ckpt"])
    assert (step_a, version_a, len(valid_a)) == (16, 1, 2)
    assert sum(valid_a) == env_a  # env_steps is the job's count: every rank's valid steps
    assert (
        a["ckpt"]["RolloutDataModule"][PER_RANK_KEY]
        == [{"dropped_stale": 0, "worker_restarts": 0, "dropped_rollouts": 0}] * 2
    )

    b = _fit(tmp_path, "one", 1, 32, "--ckpt_path", a["path"])  # 2 ranks -> 1
    assert "Restored all states from the checkpoint" in b["stderr"]
    step_b, version_b, valid_b, env_b = _counts(b["ckpt"])
    assert (step_b, version_b, len(valid_b)) == (32, 2, 1)
    # Rank 1's totals were merged into the one rank: the per-rank counts still add up to env_steps
    # (before, rank 1's were dropped with the file rank 0 alone wrote).
    assert env_b > env_a and sum(valid_b) == env_b
    adam_steps = [int(s["step"]) for s in b["ckpt"]["optimizer_states"][0]["state"].values()]
    assert set(adam_steps) == {32}  # the optimizer resumed from its 16 steps, not from scratch

    c = _fit(tmp_path, "two_again", 2, 48, "--ckpt_path", b["path"])  # 1 rank -> 2
    step_c, version_c, valid_c, env_c = _counts(c["ckpt"])
    assert (step_c, version_c, len(valid_c)) == (48, 3, 2)
    assert env_c > env_b and sum(valid_c) == env_c
    assert [r["version"] for r in c["ranks"]] == [3, 3]
    assert c["ranks"][0]["checksum"] == c["ranks"][1]["checksum"]  # still one model on both ranks
    adam_steps = [int(s["step"]) for s in c["ckpt"]["optimizer_states"][0]["state"].values()]
    assert set(adam_steps) == {48}
