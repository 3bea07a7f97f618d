"""A lost rank under ``--trainer.strategy fsdp2`` (tests/faults/ddp_stop_probe.py ``--strategy fsdp2``: 2
gloo ranks, Lightning's launcher, the policy sharded by FSDP2): no rank holds the whole model, so the
survivor saves nothing; LostRankCheckpoint's sharded checkpoints (here every 2 updates) are what is
on disk. SIGKILL of rank 0 or of rank 1 at the start of update 3: the survivor's one line names the
last complete sharded checkpoint (global step 4, update 2) and the 1 update lost; a run resumed from
it on 2 ranks and on 1 rank starts at global step 4, update 2, with the weights and Adam state the
killed run had after update 2, and trains on. Killed before any sharded checkpoint, the line says
there is nothing to resume from."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.procfs import descendants
from tests.faults.test_cli_faults import assert_no_orphans, child_env

ROOT = Path(__file__).resolve().parents[2]


def probe(root: Path, *extra: str) -> tuple[int, str]:
    """The probe under fsdp2 until every process it started has exited; its exit code and output."""
    cmd = [sys.executable, "-m", "tests.faults.ddp_stop_probe", "--root", str(root), "--strategy", "fsdp2",
           "--peer-timeout-s", "10", "--repeat", "10", *extra]  # fmt: skip
    log = root.parent / f"{root.name}.log"
    family: set[int] = set()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT)
        deadline = time.monotonic() + 300
        # rank 1 outlives a killed rank 0, its launcher: wait for it too
        while (proc.poll() is None or any(Path(f"/proc/{p}").exists() for p in family)) and (
            time.monotonic() < deadline
        ):
            family |= descendants(proc.pid) if proc.poll() is None else set()
            time.sleep(0.2)
    for pid in [proc.pid, *family] if proc.poll() is None or time.monotonic() >= deadline else []:
        with contextlib.suppress(OSError):  # past the deadline: nothing of it left running
            os.kill(pid, signal.SIGKILL)
    assert proc.poll() is not None and time.monotonic() < deadline, log.read_text()[-3000:]
    assert_no_orphans(family)
    return proc.returncode, log.read_text()


def lost_run(tmp_path: Path, lose: int, every: int = 2) -> tuple[dict, list[dict], str]:
    """Rank ``lose`` SIGKILLed at the start of update 3 (0-based), sharded checkpoints every ``every``
    updates; the survivor's report, each rank's weight sums, the output."""
    root = tmp_path / "killed"
    _, out = probe(root, "--sharded-every-updates", str(every), "--lose-rank", str(lose), "--at", "3",
                   "--updates", "8")  # fmt: skip
    survivor = 1 - lose
    report = json.loads((root / f"rank{survivor}.json").read_text())
    assert report["version"] == 3 and report["exit"].startswith("RuntimeError: "), out[-3000:]
    # Rank 1 also gets SIGTERM as its launcher, rank 0, dies (PR_SET_PDEATHSIG). The signal follows the
    # parent *thread*: as SIGKILL ends rank 0's threads one by one, the kernel re-parents rank 1 to a live
    # one and signals it again, so it may come 1 to n_threads times. After the collective failed, each
    # is ignored in a line of its own.
    ignored = "fastlight: rank 1: SIGTERM ignored (stop signal "
    lines = [ln for ln in out.splitlines() if ln.startswith("fastlight: ") and not ln.startswith(ignored)]
    assert lines == [report["peer_lost_line"]]
    return report, [json.loads((root / f"sums{r}.json").read_text()) for r in (0, 1)], out


@pytest.mark.multiproc
@pytest.mark.ranks
@pytest.mark.parametrize("lose", [0, 1])
def test_a_lost_fsdp2_rank_loses_the_updates_since_the_last_sharded_checkpoint_and_resumes(tmp_path, lose):
    report, sums, out = lost_run(tmp_path, lose)
    folder = tmp_path / "killed" / "checkpoints" / "sharded-step=4"
    why = {0: "rank 0 is unreachable: the rendezvous store it hosts at ", 1: "rank 1 was killed by SIGKILL"}
    line = report["peer_lost_line"]
    assert line.startswith(f"fastlight: rank {1 - lose}: stopped: {why[lose]}"), line
    tail = (
        "(RuntimeError in a collective) at global step 6: not saved (under --trainer.strategy fsdp2 a save "
        f"needs every rank); the last complete checkpoint is {folder} (global step 4, update 2): 1 update "
        f"completed since lost (resume with trainer.fit(..., ckpt_path={str(folder)!r}))"
    )
    assert line.endswith(tail + ("; the ranks it launched exited -9" if lose == 1 else "")), line
    # On disk: that checkpoint alone (update 1's removed once it was complete), no whole-model file.
    saved = sorted(p.relative_to(folder.parent).as_posix() for p in folder.parent.rglob("*"))
    files = (".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt")
    assert saved == ["sharded-step=4", *(f"sharded-step=4/{f}" for f in files)]
    assert sums[0]["sums"]["2"] == sums[1]["sums"]["2"]
    for devices in (2, 1):
        resumed = tmp_path / f"resumed-on-{devices}"
        rc, out = probe(resumed, "--resume", str(folder), "--devices", str(devices), "--updates", "4")
        assert rc == 0, out[-3000:]
        start = json.loads((resumed / "sums0.json").read_text())["start"]
        # Where the killed run was after update 2: the same whole weights (bitwise), Adam's 4 steps.
        assert start == {"step": 4, "version": 2, "adam_steps": [4], "sum": sums[0]["sums"]["2"]}, devices
        assert json.loads((resumed / "rank0.json").read_text())["version"] == 4  # and 2 updates more


@pytest.mark.multiproc
@pytest.mark.ranks
def test_a_lost_fsdp2_rank_before_any_sharded_checkpoint_says_there_is_nothing_to_resume_from(tmp_path):
    report, _, _ = lost_run(tmp_path, lose=1, every=100)
    assert report["peer_lost_line"] == (
        "fastlight: rank 0: stopped: rank 1 was killed by SIGKILL (RuntimeError in a collective) at global "
        "step 6: not saved (under --trainer.strategy fsdp2 a save needs every rank); nothing to resume from: "
        "no checkpoint completed in this run (3 updates of this run lost); the ranks it launched exited -9"
    )
    assert list((tmp_path / "killed").rglob("*.distcp")) == list((tmp_path / "killed").rglob("*.ckpt")) == []


def test_ckpt_path_last_resumes_the_furthest_complete_checkpoint_sharded_or_not(tmp_path):
    """``--ckpt_path last``: ``last.ckpt`` or a complete sharded folder further on (global step); a folder
    without Lightning's ``meta.pt`` (a save a lost rank left unfinished) is not a checkpoint."""
    import torch
    from jsonargparse import Namespace

    from fastlight.checkpoints import read_checkpoint
    from fastlight.cli_defaults import resume_last

    cfg = Namespace(trainer=Namespace(default_root_dir=str(tmp_path)))
    checkpoints = tmp_path / "checkpoints"
    assert resume_last(cfg) == "last"
    checkpoints.mkdir()
    torch.save({"global_step": 8, "state_dict": {}}, checkpoints / "last.ckpt")
    assert resume_last(cfg) == str(checkpoints / "last.ckpt")
    folders = {s: checkpoints / "version_1" / f"sharded-step={s}" for s in (4, 8, 12, 16)}
    for step, folder in folders.items():
        folder.mkdir(parents=True)
        if step != 16:  # 16: its shards written, not its meta.pt
            torch.save({"global_step": step, "hyper_parameters": {"lr": 0.1}}, folder / "meta.pt")
    assert resume_last(cfg) == str(folders[12])
    (folders[12] / "meta.pt").unlink()
    assert resume_last(cfg) == str(checkpoints / "last.ckpt")  # step 8 both: the one file
    # A resume reads the folder's meta.pt; anything else that reads a checkpoint refuses the folder.
    assert read_checkpoint(folders[4], flag="--ckpt_path", sharded=True)["global_step"] == 4
    with pytest.raises(ValueError, match=r"--ckpt: .*sharded-step=4 is a sharded checkpoint .* fsdp2"):
        read_checkpoint(folders[4], flag="--ckpt")
