"""A full disk under a logger (issue 40 item 5): the run stops in one line naming the logger's folder, the
error and the free space there, and the checkpoint to resume from; no logger traceback, no "stopped by
ValueError", exit 1 from the command.

In-process runs (an RLModule on fixed rollouts, PreemptionCheckpoint, Lightning's TensorBoard and CSV
loggers, guarded as the ``fastlight`` command guards them) meet the kernel's own ENOSPC as
``tests/faults/test_preemption.py`` does for the checkpoint: the logger's file is replaced by a link to
``/dev/full``, where every write fails, and the loggers' real writers write to it. The ``slow`` test runs
``fastlight fit`` on a real tmpfs that fills up (root, or user namespaces; skipped elsewhere)."""

from __future__ import annotations

import ctypes
import errno
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader

from fastlight.callbacks.preemption import PreemptionCheckpoint
from fastlight.checkpoints import AtomicCheckpointIO, verify_checksum
from fastlight.cli import cli_main
from fastlight.cli_output import one_line_errors
from fastlight.log_writes import LogWriteError, guard_logger_writes
from tests.faults.test_cli_faults import child_env, command
from tests.faults.test_preemption import Rollouts, SignalInUpdate, fastlight_lines, saved_step

FREE = r"[0-9.]+ (B|KiB|MiB|GiB) free of [0-9.]+ (B|KiB|MiB|GiB|TiB) on the filesystem of "
#: What the loggers printed before (TensorBoard's thread, Lightning's wrapping, the finalize after it).
NOISE = ("Traceback", "Exception in thread", "you tried to log", "ValueError")


def events_file(logger: L.pytorch.loggers.Logger) -> Path:
    return next(Path(logger.log_dir).glob("events.out.tfevents.*"))


def metrics_file(logger: L.pytorch.loggers.Logger) -> Path:
    return Path(logger.log_dir) / "metrics.csv"


def fill(path: Path) -> None:
    """Every later write of ``path`` fails with ENOSPC: a link to /dev/full (TensorBoard opens its file by
    name for each record, the CSV logger for each save)."""
    path.unlink(missing_ok=True)
    os.symlink("/dev/full", path)


class FillsAfter(SignalInUpdate):
    """After update ``at`` (0-based), ``files(trainer)`` meet a full device (or, ``at_end``, once training
    ended, after the last checkpoint)."""

    def __init__(self, files: Callable[[L.Trainer], list[Path]], at: int = 1, at_end: bool = False) -> None:
        super().__init__()
        self.files, self.full_at, self.at_end = files, at, at_end

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if not self.at_end and self.policy_version == self.full_at + 1:
            for path in self.files(self.trainer):
                fill(path)

    def on_train_end(self):
        if self.at_end:
            for path in self.files(self.trainer):
                fill(path)


def logged_trainer(tmp_path: Path, cb: PreemptionCheckpoint, **kw) -> L.Trainer:
    loggers = [
        TensorBoardLogger(save_dir=str(tmp_path), name="tb", version=0),
        CSVLogger(save_dir=str(tmp_path), name="csv", version=0),
    ]
    t = L.Trainer(
        logger=loggers,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        callbacks=[cb],
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(tmp_path),
        **kw,
    )
    guard_logger_writes(t.loggers)  # what the fastlight command does to its Trainer's loggers
    return t


@pytest.mark.parametrize(
    ("name", "file"), [("TensorBoardLogger", events_file), ("CSVLogger", metrics_file)], ids=["tb", "csv"]
)
def test_full_disk_under_a_logger_stops_in_one_line_with_the_checkpoint(tmp_path, capfd, name, file):
    cb = PreemptionCheckpoint(every_minutes=None)
    t = logged_trainer(tmp_path, cb, max_steps=100)
    [logger] = [lg for lg in t.loggers if type(lg).__name__ == name]
    module = FillsAfter(lambda trainer: [file(logger)])
    with pytest.raises(SystemExit) as info, one_line_errors():  # the command's exit
        t.fit(module, DataLoader(Rollouts(50), batch_size=None))
    assert info.value.code == 1
    err = capfd.readouterr().err
    [line] = fastlight_lines(err)  # printed once: by the stop, not again by the command
    assert not [n for n in NOISE if n in err], err
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    folder = Path(logger.log_dir)
    step = int(re.match(r"fastlight: stopped by LogWriteError at global step (\d+): ", line).group(1))
    assert step in (4, 6)  # the update that met the full file (TensorBoard's thread: maybe one update later)
    assert f": could not write the logs of {name} in {folder}: No space left on device (ENOSPC); " in line
    assert re.search(f"; {FREE}{re.escape(str(folder))}; ", line), line
    hint = f"trainer.fit(..., ckpt_path={str(ckpt)!r})"
    assert line.endswith(f"; checkpoint saved to {ckpt} (resume with {hint})")
    assert verify_checksum(ckpt) is True and saved_step(ckpt) == step  # the stop's checkpoint, whole


def test_full_disk_under_the_logs_and_the_checkpoint_names_the_last_good_one(tmp_path, capfd):
    """The same disk refuses the stop's checkpoint too: the line says so and names the previous file
    (an earlier run's, at step 2), unchanged."""
    cb = PreemptionCheckpoint(every_minutes=None)
    t = logged_trainer(tmp_path, cb, max_steps=100)
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {}, "global_step": 2}, ckpt)
    csv = t.loggers[1]
    module = FillsAfter(lambda trainer: [metrics_file(csv), ckpt.parent / f".{ckpt.name}.tmp-{os.getpid()}"])
    with pytest.raises(LogWriteError) as info:
        t.fit(module, DataLoader(Rollouts(50), batch_size=None))
    assert info.value.errno == errno.ENOSPC and info.value.reported
    err = capfd.readouterr().err
    [line] = fastlight_lines(err)
    assert not [n for n in NOISE if n in err], err
    folder = Path(csv.log_dir)
    assert line.startswith(
        "fastlight: stopped by LogWriteError at global step 4: could not write the logs of CSVLogger in "
        f"{folder}: No space left on device (ENOSPC); "
    )
    failed = f"; saving the checkpoint failed: could not save checkpoint {ckpt}: No space left on device"
    assert f"{failed} (ENOSPC); " in line
    assert line.endswith(f"; last good checkpoint to resume from: {ckpt} (unchanged)")
    assert verify_checksum(ckpt) is True and saved_step(ckpt) == 2
    assert os.listdir(ckpt.parent) == ["last.ckpt"]  # the failed save's temporary name is gone


def test_a_failed_last_flush_after_training_names_the_saved_checkpoint(tmp_path, capfd):
    """Lightning finalizes the loggers after the fit's teardown: TensorBoard's hparams.yaml, written
    there, meets the full disk once the final checkpoint is on disk."""
    cb = PreemptionCheckpoint(every_minutes=None)
    t = logged_trainer(tmp_path, cb, max_steps=6)
    tb = t.loggers[0]
    module = FillsAfter(lambda trainer: [Path(tb.log_dir) / "hparams.yaml"], at_end=True)
    with pytest.raises(SystemExit) as info, one_line_errors():
        t.fit(module, DataLoader(Rollouts(50), batch_size=None))
    assert info.value.code == 1
    err = capfd.readouterr().err
    [line] = fastlight_lines(err)
    assert not [n for n in NOISE if n in err], err
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert line.startswith(
        f"fastlight: training finished at global step 6, checkpoint saved to {ckpt}; then could not write "
        f"the logs of TensorBoardLogger in {tb.log_dir}: No space left on device (ENOSPC); "
    )
    assert saved_step(ckpt) == 6


def test_the_command_guards_its_loggers(tmp_path):
    """``fastlight fit``'s Trainer: a failed write of its (default) loggers is the one line."""
    config = str(Path(__file__).resolve().parents[2] / "configs" / "highway_dpsa.yaml")
    args = ["--config", config, "--data.env_id", "tests.fake_envs:Fault-v0"]
    cli = cli_main([*args, "--trainer.default_root_dir", str(tmp_path)], run=False)
    tb, csv = cli.trainer.loggers
    assert (type(tb), type(csv)) == (TensorBoardLogger, CSVLogger)
    csv.log_metrics({"x": 1.0}, step=0)  # kept in memory until save
    fill(metrics_file(csv))
    with pytest.raises(LogWriteError) as info:
        csv.save()
    assert info.value.strerror.startswith(f"could not write the logs of CSVLogger in {csv.log_dir}: No space")
    assert csv.save() is None  # a logger whose write failed tries no more


def test_other_errors_of_a_logger_pass_through_unchanged(tmp_path):
    """Only a failed write (an OSError in the chain) is turned into the line: a logger's own bug keeps
    its exception and traceback."""

    class Broken(CSVLogger):
        def log_metrics(self, metrics, step=None):
            raise KeyError("a bug in a logger")

    logger = Broken(save_dir=str(tmp_path))
    guard_logger_writes([logger])
    with pytest.raises(KeyError, match="a bug in a logger"):
        logger.log_metrics({"x": 1.0}, 0)
    logger.save()  # still writing: only a failed write stops a logger


# --- a real full filesystem under `fastlight fit` -------------------------------------------------------


def mount_tmpfs(folder: Path, size: str) -> None:
    """In the child, before exec: a private mount namespace (nothing leaks to the host) with a tmpfs of
    ``size`` at ``folder``."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
        raise OSError(ctypes.get_errno(), "unshare")
    if libc.mount(b"none", b"/", None, 0x4000 | (1 << 18), None) != 0:  # MS_REC | MS_PRIVATE
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    if libc.mount(b"fastlight-test", os.fsencode(folder), b"tmpfs", 0, f"size={size}".encode()) != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs on {folder}")


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs in a private namespace needs root")
@pytest.mark.parametrize("where", [".", "tb"], ids=["everything", "tensorboard"])
def test_fit_on_a_disk_that_fills_up_exits_1_in_one_line(tmp_path, where):
    """``fastlight fit`` with a 16 MiB tmpfs under the run root (every file) or under its TensorBoard
    folder only; once updates are logged the test fills it (through ``/proc/<pid>/root``, the run's view
    of its mounts). Before: 137 lines, 3 tracebacks, ``stopped by ValueError``."""
    root = tmp_path / "run"
    disk = root / where
    disk.mkdir(parents=True)
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command(root),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(),
            preexec_fn=lambda: mount_tmpfs(disk, "16m"),
        )
    seen = Path(f"/proc/{proc.pid}/root")  # the child's mounts, as it sees them

    def inside(path: Path) -> Path:
        return seen / path.relative_to("/")

    metrics = inside(root / "csv" / "version_0" / "metrics.csv")
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "no update logged"
        time.sleep(0.2)
    with open(inside(disk / "filler"), "wb") as f, pytest.raises(OSError) as full:
        while True:
            f.write(b"\0" * (1 << 20))
            f.flush()
    assert full.value.errno == errno.ENOSPC
    assert proc.wait(timeout=180) == 1
    text = log.read_text()
    [line] = fastlight_lines(text)[-1:]
    assert not [n for n in NOISE if n in text], text
    assert len([t for t in fastlight_lines(text) if "stopped by" in t]) == 1, text
    assert line.startswith("fastlight: stopped by LogWriteError at global step ")
    assert re.search(r"could not write the logs of (TensorBoardLogger|CSVLogger) in ", line), line
    assert "No space left on device (ENOSPC); 0 B free of 16.0 MiB on the filesystem of " in line, line
    ckpt = root / "checkpoints" / "last.ckpt"
    if where == ".":  # the checkpoint's disk is full too: nothing saved, and no earlier checkpoint
        assert "; saving the checkpoint failed: could not save checkpoint " in line, line
        assert line.endswith("; no earlier checkpoint to resume from"), line
    else:  # the checkpoint is elsewhere: saved, and it loads
        assert "TensorBoardLogger" in line, line
        assert line.endswith(f"; checkpoint saved to {ckpt} (resume with --ckpt_path {ckpt})"), line
        assert verify_checksum(ckpt) is True and saved_step(ckpt) > 0
