"""A coordinated stop under DDP, in real processes (``fastlight fit``, 2 gloo ranks on CPU, one
sampler each): a stop signal to rank 1 alone, or to the whole process group (twice), stops both
ranks after the same update with exit 143 well within 60 s, rank 0 writes one loadable checkpoint of
that update, no process is left (ranks, samplers, forkservers) and no sampler is restarted. And SLURM's
requeue signal under the SLURM variables (a fake ``scontrol`` on PATH) requeues the job, which
resumes from the checkpoint."""

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

ROOT = Path(__file__).resolve().parents[2]
STOP_BOUND_S = 60.0


def ddp_command(root: Path, *extra: str) -> list[str]:
    """test_cli_faults' endless run on 2 DDP ranks, one sampler each, through the command's own
    entry (``python -m fastlight``: each rank warms a forkserver, as users run it)."""
    cmd = command(root, "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu",
                  "--data.num_workers", "1", "--data.num_envs", "1", *extra)  # fmt: skip
    cmd[1:3] = ["-m", "fastlight"]
    return cmd


def start_ddp(root: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    log = root.parent / f"{root.name}.log"
    with open(log, "w") as f:  # its own session: the test can signal its whole process group
        cmd = ddp_command(root, *extra)
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT,
                                start_new_session=True)  # fmt: skip
    return proc, log


def rank_pid(launcher: int, rank: int) -> int:
    """The pid of local rank ``rank``, started by Lightning's launcher in process ``launcher``."""
    for pid in descendants(launcher):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"fit" in cmdline and b"-c" not in cmdline and f"LOCAL_RANK={rank}".encode() in environ:
            return pid  # a rank, not a forkserver or a sampler forked from it (they run `python -c`)
    raise AssertionError(f"no rank {rank} below pid {launcher}")


def trained_updates(root: Path) -> int:
    """Updates rank 0 logged: the rows of its metrics.csv (one per training step)."""
    rows = (root / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[1:]
    return len([r for r in rows if r.strip()])


def assert_one_checkpoint_of_the_last_update(root: Path, line: str) -> None:
    stable, written = root / "checkpoints" / "last.ckpt", root / "checkpoints" / "version_0" / "last.ckpt"
    # Rank 0's one file, under its two names (the run's and the stable one), nothing else.
    assert sorted(p.relative_to(root) for p in root.rglob("*.ckpt")) == [
        stable.relative_to(root),
        written.relative_to(root),
    ]
    assert os.path.samefile(stable, written)
    assert verify_checksum(stable) is True
    ckpt = torch.load(stable, weights_only=False)
    step = ckpt["global_step"]
    assert step > 0 and step % 2 == 0 and f" at global step {step}; " in line  # whole updates only
    # Every update trained is in the checkpoint, none lost: rank 0 logged all but the last one (the
    # stop comes at its end, before Lightning logs its metrics), which the checkpoint holds too.
    assert int(ckpt["state_dict"]["_policy_version"]) == step // 2 == trained_updates(root) + 1


def assert_clean_stop(log: Path, rc: int, seconds: float, family: set[int]) -> str:
    text = log.read_text()
    assert rc == 143, text[-3000:]
    assert seconds < STOP_BOUND_S, seconds
    line = last_line(log)
    assert line.startswith("fastlight: stopped by SIGTERM at global step ")
    assert line.endswith("; the ranks it launched exited 143"), line  # rank 1: 128 + SIGTERM as well
    assert "Traceback" not in text
    assert "restarting" not in text  # no sampler restarted while stopping (nor died of the signal)
    assert_no_orphans(family)
    return line


@pytest.mark.multiproc
@pytest.mark.ranks
def test_stop_signal_in_rank_1_stops_both_ranks_and_second_signals_wait_for_the_checkpoint(tmp_path):
    """Lightning's DDP launcher, no samplers (tests/faults/ddp_stop_probe.py): rank 1 signals itself
    in update 2; during the stop save rank 0 gets a SIGINT and rank 1 a SIGTERM, both ignored."""
    root = tmp_path / "probe"
    cmd = [sys.executable, "-m", "tests.faults.ddp_stop_probe", "--root", str(root), "--signal-rank", "1",
           "--at", "2", "--second"]  # fmt: skip
    log = tmp_path / "probe.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT)
    family: set[int] = set()
    while proc.poll() is None:  # rank 1 appears once rank 0 reaches fit
        family |= descendants(proc.pid)
        time.sleep(0.2)
    out = log.read_text()
    assert proc.returncode == 143, out[-3000:]
    ranks = [json.loads((root / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["exit"] for r in ranks] == [143, 143]
    # Both stopped after update 2 (0-based): 3 updates, one agreement each, nothing further.
    assert [r["version"] for r in ranks] == [3, 3] and [r["agreements"] for r in ranks] == [3, 3]
    assert [r["ignored"] for r in ranks] == [1, 1]
    ckpt = root / "checkpoints" / "last.ckpt"
    lines = [ln for ln in out.splitlines() if ln.startswith("fastlight: ")]
    assert len(lines) == 3, lines
    assert sorted(lines[:2]) == [  # one line per ignored signal, from each rank (in either order)
        f"fastlight: rank {r}: {name} ignored (stop signal 2): the run stops once its checkpoint is on disk; "
        "SIGKILL stops it at once, without one"
        for r, name in ((0, "SIGINT"), (1, "SIGTERM"))
    ]
    assert lines[2] == (
        f"fastlight: stopped by SIGTERM at global step 6; checkpoint saved to {ckpt} (resume with "
        f"trainer.fit(..., ckpt_path={str(ckpt)!r})); the ranks it launched exited 143"
    )
    assert os.listdir(ckpt.parent) == ["last.ckpt"] and verify_checksum(ckpt) is True
    saved = torch.load(ckpt, weights_only=False)
    assert saved["global_step"] == 6 and int(saved["state_dict"]["_policy_version"]) == 3
    assert len(family) >= 1  # rank 1 was seen
    assert_no_orphans(family)


@pytest.mark.slow  # a 2-rank `fastlight fit` with samplers: ~40 s on 2 loaded cores
@pytest.mark.multiproc
def test_sigterm_to_rank_1_only_stops_both_ranks_after_the_same_update(tmp_path):
    root = tmp_path / "run"
    proc, log = start_ddp(root)
    wait_for_training(proc, root)
    family = descendants(proc.pid)  # rank 1, both ranks' samplers, forkservers, resource trackers
    rank1 = rank_pid(proc.pid, 1)
    t0 = time.monotonic()
    os.kill(rank1, signal.SIGTERM)  # rank 1 alone: it used to block in Lightning's broadcast forever
    rc = proc.wait(timeout=STOP_BOUND_S + 60)
    line = assert_clean_stop(log, rc, time.monotonic() - t0, family)
    assert_one_checkpoint_of_the_last_update(root, line)
    assert "ignored" not in log.read_text()


@pytest.mark.slow  # another 2-rank run (~40 s on 2 loaded cores); rank 1 alone is above
@pytest.mark.multiproc
def test_group_sigterm_twice_stops_both_ranks_once(tmp_path):
    """``kill -TERM -PGID`` (SLURM's ``scancel``), then again: every process of the job gets it,
    samplers and forkservers included, which ignore it."""
    root = tmp_path / "run"
    proc, log = start_ddp(root)
    wait_for_training(proc, root)
    family = descendants(proc.pid)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    rc = proc.wait(timeout=STOP_BOUND_S + 60)
    line = assert_clean_stop(log, rc, time.monotonic() - t0, family)
    assert_one_checkpoint_of_the_last_update(root, line)
    # The second one, 0.5 s later, finds each rank stopping (one line: ignored) or already past its
    # checkpoint, exiting (ignored without a line): either way it changes no exit code.
    ignored = [ln for ln in log.read_text().splitlines() if " ignored (stop signal" in ln]
    assert {ln.split(": ")[1] for ln in ignored} <= {"rank 0", "rank 1"}, ignored
    assert all(" SIGTERM ignored (stop signal 2): " in ln for ln in ignored), ignored


@pytest.mark.slow  # two single-process runs (~45 s)
@pytest.mark.multiproc
def test_slurm_requeue_signal_requeues_and_the_job_resumes(tmp_path):
    """``#SBATCH --signal=SIGUSR1@90`` under SLURM (its variables set, one task): SIGUSR1 stops the
    run with a checkpoint (exit 138), which gets Lightning's ``hpc_ckpt_1.ckpt`` name too, then
    ``scontrol requeue <job>`` (a fake one on PATH records it). The requeued job, the same command,
    resumes from it."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.calls"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    env = child_env()
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", SLURM_JOB_ID="4242", SLURM_JOB_NAME="train",
               SLURM_NTASKS="1", SLURM_NTASKS_PER_NODE="1", SLURM_NNODES="1", SLURM_NODEID="0",
               SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODELIST="localhost")  # fmt: skip
    root = tmp_path / "run"
    cmd = command(root, "--data.num_workers", "1", "--data.num_envs", "1")
    log = tmp_path / "run.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    wait_for_training(proc, root)
    family = descendants(proc.pid)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGUSR1)
    rc = proc.wait(timeout=STOP_BOUND_S + 60)
    assert rc == 138, log.read_text()[-3000:]
    assert time.monotonic() - t0 < STOP_BOUND_S
    hpc = root / "hpc_ckpt_1.ckpt"
    line = last_line(log)
    assert line.startswith("fastlight: stopped by SIGUSR1 at global step ")
    assert line.endswith(f"; requeued SLURM job 4242; it resumes from {hpc}"), line
    assert calls.read_text() == "requeue 4242\n"
    assert os.path.samefile(hpc, root / "checkpoints" / "version_0" / "last.ckpt")  # a link, no copy
    assert verify_checksum(hpc) is True
    assert_no_orphans(family)
    step = torch.load(hpc, weights_only=False)["global_step"]
    # The requeued job: the same command and variables, without --ckpt_path; 2 more updates.
    again = [*cmd, "--trainer.max_steps", str(step + 4)]
    done = subprocess.run(again, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == step + 4
