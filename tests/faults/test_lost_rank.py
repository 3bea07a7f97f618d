"""A lost rank under DDP, in real processes (tests/faults/ddp_stop_probe.py: 2 gloo ranks, Lightning's
own launcher): SIGKILL or SIGSTOP of rank 1 stops rank 0 within the peer timeout with one line naming
rank 1, the checkpoint of the last completed update written by rank 0 alone, rank 1 ended, nothing
left running; a loss in the middle of an update writes no checkpoint of a half-applied update (with
LostRankCheckpoint's rollback, the update before it; without, nothing, and the line says so). And a
rank whose launcher (torchrun's agent) is SIGKILLed stops with the coordinated stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.procfs import descendants
from fastlight.checkpoints import verify_checksum
from tests.faults.test_cli_faults import assert_no_orphans, child_env, command, last_line, wait_for_training
from tests.faults.test_ddp_stop import assert_one_checkpoint_of_the_last_update

ROOT = Path(__file__).resolve().parents[2]
PEER_TIMEOUT_S = 10.0
#: Loss to exit, beyond what is waited for on purpose: rank 0's stop, its save and its exit, on 2
#: loaded cores (a few seconds when quiet).
SLACK_S = 50.0


def run_probe(
    tmp_path: Path, *extra: str, timeout_s: float = PEER_TIMEOUT_S
) -> tuple[int, dict, float, Path, str]:
    """The probe with rank 1 lost at update 2; returns rank 0's exit code, its report, the seconds
    from the loss to rank 0's exit, the root and the output."""
    root = tmp_path / "probe"
    cmd = [sys.executable, "-m", "tests.faults.ddp_stop_probe", "--root", str(root), "--lose-rank", "1",
           "--at", "2", "--peer-timeout-s", str(timeout_s), *extra]  # fmt: skip
    log = tmp_path / "probe.log"
    family: set[int] = set()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT)
        while proc.poll() is None:
            family |= descendants(proc.pid)
            time.sleep(0.2)
    ended = time.time()
    out = log.read_text()
    lost_at = float((root / "lost_at.txt").read_text())
    assert len(family) >= 1  # rank 1 was seen
    assert_no_orphans(family)  # rank 1 (killed or stopped) ended by rank 0 too
    # `pytest -s` shows the row of benchmarks/results/faults.md.
    print(f"\n{' '.join(extra)}: exit {proc.returncode}, {ended - lost_at:.1f} s from the loss to the exit")
    return proc.returncode, json.loads((root / "rank0.json").read_text()), ended - lost_at, root, out


def assert_saved_update(root: Path, step: int) -> None:
    ckpt = root / "checkpoints" / "last.ckpt"
    assert os.listdir(ckpt.parent) == ["last.ckpt"] and verify_checksum(ckpt) is True
    saved = torch.load(ckpt, weights_only=False)
    assert saved["global_step"] == step and int(saved["state_dict"]["_policy_version"]) == step // 2


def stopped_line(root: Path, why: str, code: int) -> str:
    ckpt = root / "checkpoints" / "last.ckpt"
    return (
        f"fastlight: rank 0: stopped: rank 1 {why} (RuntimeError in a collective) at global step 4; "
        f"checkpoint of the last completed update saved to {ckpt} (resume with trainer.fit(..., "
        f"ckpt_path={str(ckpt)!r}); it holds the per-rank state of the surviving ranks only); the ranks it "
        f"launched exited {code}"
    )


@pytest.mark.multiproc
@pytest.mark.ranks
def test_sigkill_of_rank_1_stops_rank_0_with_the_last_update_saved(tmp_path):
    # A peer timeout far above the bound: the loss is seen without waiting for it.
    rc, report, seconds, root, out = run_probe(tmp_path, "--lose-signal", "SIGKILL", timeout_s=300.0)
    assert rc == 1, out[-3000:]
    # Lightning's observer used to SIGKILL rank 0 within 5 s of rank 1's death, before any checkpoint.
    assert report["peer_lost_line"] == stopped_line(root, "was killed by SIGKILL", -9), out[-3000:]
    assert report["version"] == 2 and report["exit"].startswith("RuntimeError: ")
    assert_saved_update(root, 4)  # updates 0 and 1, all that rank 1 completed
    assert seconds < SLACK_S, seconds  # the launcher saw it die: no timeout to wait for
    assert [ln for ln in out.splitlines() if ln.startswith("fastlight: ")] == [report["peer_lost_line"]]


@pytest.mark.slow  # ~40 s: the peer timeout is waited for
@pytest.mark.multiproc
def test_sigstop_of_rank_1_stops_rank_0_after_the_peer_timeout(tmp_path):
    rc, report, seconds, root, out = run_probe(tmp_path, "--lose-signal", "SIGSTOP")
    assert rc == 1, out[-3000:]
    line = report["peer_lost_line"]
    head = "fastlight: rank 0: stopped: rank 1 stopped sending heartbeats "
    tail = stopped_line(root, "X", -9).split("rank 1 X ", 1)[1]
    assert line.startswith(head) and line.endswith(" s ago (killed, stopped, or its node is gone) " + tail), (
        line
    )
    assert_saved_update(root, 4)
    # The collective waits the process-group timeout (10 s), then the verdict needs no more beats.
    assert PEER_TIMEOUT_S <= seconds < PEER_TIMEOUT_S + SLACK_S, seconds


@pytest.mark.slow  # ~30 s
@pytest.mark.multiproc
def test_a_loss_in_the_middle_of_an_update_saves_the_update_before_it(tmp_path):
    """Rank 1 dies after update 2's first optimizer step: rank 0 holds a half-applied update, and
    writes the state at that update's start (its rollback point), not the half-applied one."""
    rc, report, _, root, out = run_probe(tmp_path, "--lose-signal", "SIGKILL", "--mid", "--rollback")
    assert rc == 1, out[-3000:]
    ckpt = root / "checkpoints" / "last.ckpt"
    assert report["peer_lost_line"] == (
        "fastlight: rank 0: stopped: rank 1 was killed by SIGKILL (RuntimeError in a collective) during an "
        "update (global step 5, rolled back to 4); checkpoint of the last completed update saved to "
        f"{ckpt} (resume with trainer.fit(..., ckpt_path={str(ckpt)!r}); it holds the per-rank state of the "
        "surviving ranks only); the ranks it launched exited -9"
    )
    assert_saved_update(root, 4)
    saved = torch.load(ckpt, weights_only=False)
    boundary = torch.load(root / "boundary.pt", weights_only=False)  # rank 0 at the end of update 1
    assert saved["state_dict"].keys() == boundary["state_dict"].keys()
    for k, v in boundary["state_dict"].items():  # the same tensors, copied: bitwise
        assert torch.equal(saved["state_dict"][k], v), k
    (state,) = saved["optimizer_states"]
    assert state["state"].keys() == boundary["optimizer"]["state"].keys()
    for i, entry in boundary["optimizer"]["state"].items():
        for name, value in entry.items():
            assert torch.equal(state["state"][i][name], value), (i, name)
    assert state["state"][0]["step"].item() == 4  # Adam's count: 2 updates x 2 steps, not 5
    loop = saved["loops"]["fit_loop"]["epoch_loop.manual_optimization.optim_step_progress"]["total"]
    assert loop["completed"] == 4


@pytest.mark.slow  # ~30 s
@pytest.mark.multiproc
def test_a_loss_in_the_middle_of_an_update_without_rollback_writes_nothing_and_says_so(tmp_path):
    """The default (no copy at every update): rank 0 holds a half-applied update, writes no
    checkpoint of it, and its one line names what it could not save and the file to resume from."""
    rc, report, _, root, out = run_probe(tmp_path, "--lose-signal", "SIGKILL", "--mid")
    assert rc == 1, out[-3000:]
    ckpt = root / "checkpoints" / "last.ckpt"
    assert report["peer_lost_line"] == (
        "fastlight: rank 0: stopped: rank 1 was killed by SIGKILL (RuntimeError in a collective) during an "
        "update (global step 5; the last completed update ended at step 4): not saved, as this rank holds "
        "part of that update and no copy of its start (LostRankCheckpoint rollback: false); resume from the "
        f"last checkpoint on disk, {ckpt} (if any); the ranks it launched exited -9"
    )
    assert list(root.rglob("*.ckpt")) == []  # no checkpoint of the half-applied update, nor of any other
    assert [ln for ln in out.splitlines() if ln.startswith("fastlight: ")] == [report["peer_lost_line"]]


@pytest.mark.slow  # a 2-rank `fastlight fit` under torchrun: ~60 s on 2 loaded cores
@pytest.mark.multiproc
def test_sigkill_of_the_torchrun_agent_stops_its_ranks_with_the_coordinated_stop(tmp_path):
    root = tmp_path / "run"
    cmd = command(root, "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu",
                  "--data.num_workers", "1", "--data.num_envs", "1")  # fmt: skip
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--nnodes", "1", "--nproc_per_node", "2",
                "--master_port", str(free_port()), "-m", "fastlight", *cmd[3:]]  # fmt: skip
    log = tmp_path / "run.log"
    with open(log, "w") as f:
        agent = subprocess.Popen(torchrun, stdout=f, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT,
                                 start_new_session=True)  # fmt: skip
    wait_for_training(agent, root)
    family = descendants(agent.pid)
    t0 = time.monotonic()
    agent.send_signal(signal.SIGKILL)  # the ranks (own sessions) used to keep training with their samplers
    agent.wait(timeout=30)
    deadline = time.monotonic() + 90
    while any(Path(f"/proc/{pid}").exists() for pid in family) and time.monotonic() < deadline:
        time.sleep(0.5)
    seconds = time.monotonic() - t0
    print(f"\ntorchrun agent SIGKILL: {seconds:.1f} s to the last process's exit")
    assert_no_orphans(family)
    assert seconds < 60.0, seconds
    line = last_line(log)
    assert line.startswith("fastlight: stopped by SIGTERM at global step "), log.read_text()[-3000:]
    assert_one_checkpoint_of_the_last_update(root, line)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
