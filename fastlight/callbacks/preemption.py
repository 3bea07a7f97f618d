"""``PreemptionCheckpoint``: a run that is stopped or fails leaves a checkpoint to resume from.

SLURM and Kubernetes send SIGTERM before they preempt a job (SLURM's requeue signal is often
SIGUSR1), and a person stops a run with Ctrl-C (SIGINT). Lightning alone stops after the batch on
SIGTERM and exits 0 without a checkpoint, turns SIGINT into a KeyboardInterrupt wherever the main
thread happens to be, in the middle of an optimizer step included, and under DDP enters a
broadcast from inside its SIGTERM handler, which deadlocks a job signalled on one rank other than 0
(:mod:`fastlight.callbacks.stop_signals`). This callback:

- handles SIGTERM, SIGINT and SIGUSR1 (and SLURM's requeue signal) during ``fit``, installed through
  Lightning's own signal connector. The handler notes the signal and enters no collective. With
  one process it stops at once outside an update (e.g. while the trainer waits for a rollout), and
  right after the update during one, so a checkpoint never holds a half-applied update. With
  several ranks, a signal to any one of them (or to the whole process group) stops them all after
  the same update: at every update's end the ranks agree, in one small all-reduce, on whether any
  of them was signalled (and whether the timer save is due), then stop together;
- on any exception during training (a signal, a sampler fault, an env's non-finite value) first
  ends the samplers (so none is restarted while it stops), then writes ``<dirpath>/<filename>.ckpt``
  (rank 0 writes, every rank takes part) and prints one line saying what happened and where the
  checkpoint is. From the first stop signal until the checkpoint is on disk, further stop signals
  (a second Ctrl-C, a twice-delivered SIGTERM) are ignored, one line each: only SIGKILL ends the
  process without its checkpoint;
- exits with the signal's conventional code, 128 + signum (SIGINT 130, SIGTERM 143, SIGUSR1 138), on
  every rank, so schedulers and shells see that the run did not finish; a signal that arrives while
  a checkpoint is being written (a timer save) waits for it, and never turns into a write error;
- under SLURM with auto-requeue, on its requeue signal (``#SBATCH --signal=SIGUSR1@90``), once the
  checkpoint is on disk, gives it Lightning's ``hpc_ckpt_N.ckpt`` name too and requeues the job with
  ``scontrol requeue`` (Lightning's own SLURM path, run at the agreed stop instead of inside a signal
  handler): the requeued job resumes from it;
- also saves every ``every_minutes`` of training (bounding the work a SIGKILL or power cut can
  lose; all ranks together), and when training ends;
- says so when a resumed checkpoint is already at ``--trainer.max_steps`` (nothing to train).

A rank that is lost (SIGKILLed, SIGSTOPped, hung, its node gone) stops the others within
``peer_timeout_minutes`` (the process-group timeout this callback sets; a killed rank within seconds)
with one line naming it: :mod:`fastlight.callbacks.peer_watch` tells which rank it was, and the lowest
surviving rank writes the checkpoint of the last completed update without entering a collective
(with the per-rank state of the survivors only); for a loss in the middle of an update, from a host
copy of what the update changes taken at its start (:mod:`fastlight.callbacks.rollback_point`, up to
``rollback_max_mb``). A rank whose launcher (torchrun's
agent, Lightning's launcher) dies gets SIGTERM, i.e. the coordinated stop.

A checkpoint that cannot be written (full disk, read-only filesystem, I/O error) stops the run with
one line naming the path, the free space and the last good checkpoint to resume from
(:class:`~fastlight.checkpoints.CheckpointWriteError`), on every rank.

Its file, ``<default_root_dir>/checkpoints/last.ckpt`` by default, is the one newest checkpoint to
resume from, and this callback is its only writer: it is the one that saves at every way a run ends
(its last update, a stop signal, a fault) and on a timer, whereas ``ModelCheckpoint(save_last=True)``
saves at its own triggers only, and names its file ``last-v1.ckpt`` when a ``last.ckpt`` is already
in its folder (another run's, or this callback's). The ``fastlight`` CLI therefore turns the
``save_last`` of the ModelCheckpoint it places off, and has this callback save at every epoch end
instead (``every_epoch``). A time trigger of its own rather than ``ModelCheckpoint(
train_time_interval=...)``: ModelCheckpoint's triggers are mutually exclusive, and a second
ModelCheckpoint would write a second "newest" file. The ``fastlight`` CLI attaches it unless the
config does (then with the config's settings).

With ``version=N`` (the ``fastlight`` CLI sets it, one number per run) the run writes
``<dirpath>/version_N/<filename>.ckpt``, next to that run's ModelCheckpoint files, and after every
save ``<dirpath>/<filename>.ckpt`` is made a second name (a hard link; a copy where the filesystem
has none) of that file, atomically: the stable path always holds the newest checkpoint of the latest
run to save one, is a plain file (``--ckpt_path``, ``--model.init_from``, ``mv`` and ``rsync`` treat it
as one), and costs no extra disk. A file already at the stable path that is no other file's second
name (from before versioned folders, or whose run folder was deleted) is kept, renamed
``<filename>-before-version_N.ckpt``, never overwritten.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from fastlight import rank_state
from fastlight.callbacks import peer_watch, stop_signals
from fastlight.callbacks.rollback_point import RollbackPoint
from fastlight.checkpoints import CheckpointWriteError, save_in_progress, saving, write_error_line
from fastlight.data.protocols import StopsSampling
from fastlight.procs import STOP_SIGNALS

__all__ = ["STOP_SIGNALS", "Preempted", "PreemptionCheckpoint"]

#: How long rank 0 waits for the ranks it launched to exit after a stop, before it SIGKILLs them.
RANKS_EXIT_TIMEOUT_S = 30.0


class Preempted(SystemExit):
    """Raised in the trainer when a stop signal arrives; exits the process with 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + int(signum))
        self.signum = int(signum)


class PreemptionCheckpoint(Callback):
    """Checkpoint on SIGTERM / SIGINT / SIGUSR1, on any training exception, and every N minutes.

    Args:
        dirpath: folder of the checkpoint; ``None`` = ``<default_root_dir>/checkpoints``.
        filename: checkpoint name without ``.ckpt``.
        every_minutes: also save every this many minutes of training; ``None`` disables.
        handle_signals: install the signal handlers (off: only exceptions and the timer save; Lightning
            keeps its own SIGTERM handling, which is not safe under DDP, see the module docstring).
        version: this run's folder, ``<dirpath>/version_<version>``, which holds the files it writes;
            ``<dirpath>/<filename>.ckpt`` is then the newest of them, under a second name (see the
            module docstring). ``None``: the file is written at ``<dirpath>/<filename>.ckpt`` itself.
        every_epoch: also save at the end of every training epoch.
        peer_timeout_minutes: with several ranks, the process-group timeout and the bound on how long
            the survivors wait for a lost rank before they stop (see the module docstring); longer
            than the slowest checkpoint write (the other ranks wait for it). ``None``: Lightning's
            own timeout (30 minutes) and no heartbeat.
        rollback_max_mb: with ``peer_timeout_minutes``, the most host memory (MiB) the copy of an
            update's starting state may take (trainable weights, buffers, optimizer state; copied at
            every update's start), which lets a survivor save the last completed update after a loss
            in the middle of the next one; a larger state gets no copy (such a loss then keeps the
            checkpoint on disk from before). ``0``: never copy.
    """

    def __init__(
        self,
        dirpath: str | None = None,
        filename: str = "last",
        every_minutes: float | None = 30.0,
        handle_signals: bool = True,
        version: int | None = None,
        every_epoch: bool = False,
        peer_timeout_minutes: float | None = peer_watch.DEFAULT_PEER_TIMEOUT_MINUTES,
        rollback_max_mb: float = 2048.0,
    ) -> None:
        if every_minutes is not None and every_minutes <= 0:
            raise ValueError(f"PreemptionCheckpoint every_minutes must be > 0 or null, got {every_minutes}")
        if not filename:
            raise ValueError("PreemptionCheckpoint filename must not be empty")
        if version is not None and version < 0:
            raise ValueError(f"PreemptionCheckpoint version must be >= 0 or null, got {version}")
        if peer_timeout_minutes is not None and peer_timeout_minutes <= 0:
            raise ValueError(
                f"PreemptionCheckpoint peer_timeout_minutes must be > 0 or null, got {peer_timeout_minutes}"
            )
        self.peer_timeout_minutes = peer_timeout_minutes
        if rollback_max_mb < 0:
            raise ValueError(f"PreemptionCheckpoint rollback_max_mb must be >= 0, got {rollback_max_mb}")
        self.rollback_max_mb = rollback_max_mb
        self.rollback: RollbackPoint | None = None  # with a peer watch: the current update's start
        self.dirpath = dirpath
        self.filename = filename
        self.every_minutes = every_minutes
        self.handle_signals = handle_signals
        self.version = version
        self.every_epoch = every_epoch
        self._stable_checked = False  # the file found at ckpt_path before this run's first save
        self.saves = 0  # checkpoints this callback wrote (timer + stop)
        #: How the stop line says to resume (``{path}``: the checkpoint). A plain Lightning script
        #: resumes through ``fit``; the ``fastlight`` command sets its ``--ckpt_path`` flag here.
        self.resume_hint = "trainer.fit(..., ckpt_path={path!r})"
        self.ignored_signals = 0  # stop signals that came after the first one of this fit
        #: The per-update agreement of the ranks: how many, and their total wall time (seconds).
        self.agreements = 0
        self.agreement_seconds = 0.0
        self._connector: stop_signals.StopSignalConnector | None = None
        self._active = False  # a fit is running (setup .. teardown)
        self._trained = False  # on_train_start ran in this fit
        self._in_update = False
        self._distributed = False  # several ranks: a signal only sets the flag, the ranks agree
        self._rank = 0
        self._signum: int | None = None  # the stop signal of this fit (the first one, or the agreed one)
        self._stopping = False  # the stop has begun (its checkpoint is being written, or is written)
        self._saved_step: int | None = None  # the global step of this fit's last checkpoint
        self._last_save = time.monotonic()
        self._peers: peer_watch.PeerWatch | None = None
        self._boundary_step: int | None = None  # the global step at the end of the last completed update
        #: The line of a stop after a lost rank (this rank's), once printed; the CLI then exits 1 quietly.
        self.peer_lost_line: str | None = None

    @property
    def ckpt_path(self) -> str:
        """The stable path to resume from: the newest checkpoint (of the latest run, with ``version``)."""
        return os.path.join(self.dirpath or "checkpoints", f"{self.filename}.ckpt")

    @property
    def run_dir(self) -> str | None:
        """This run's folder, ``<dirpath>/version_<version>``; ``None`` without ``version``."""
        if self.version is None or "://" in (self.dirpath or ""):  # remote storage: no links there
            return None
        return os.path.join(self.dirpath or "checkpoints", f"version_{self.version}")

    @property
    def run_ckpt_path(self) -> str:
        """The file this run writes (``ckpt_path`` itself without ``version``)."""
        folder = self.run_dir
        return self.ckpt_path if folder is None else os.path.join(folder, f"{self.filename}.ckpt")

    # ------------------------------------------------------------------ signals
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The stop-signal handler: notes the signal, enters no collective, raises only where one
        process can stop at once (outside an update, no checkpoint being written)."""
        if self._signum is not None or self._stopping:
            self.ignored_signals += 1
            rank = f"rank {self._rank}: " if self._distributed else ""
            # os.write, not print: the handler may run inside a print of the main thread, and a
            # buffered stream refuses a reentrant write.
            line = (
                f"fastlight: {rank}{signal.Signals(signum).name} ignored (stop signal "
                f"{self.ignored_signals + 1}): the run stops once its checkpoint is on disk; "
                "SIGKILL stops it at once, without one\n"
            )
            with contextlib.suppress(OSError):
                os.write(2, line.encode())
            return
        self._signum = signum
        if self._distributed or self._in_update or save_in_progress():
            return  # at the end of the update (all ranks together), or once the file is on disk
        raise Preempted(signum)

    # ------------------------------------------------------------------ Lightning hooks
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.join(trainer.default_root_dir, "checkpoints")
        if stage == "fit" and self.run_dir is not None and trainer.is_global_zero:
            # Taken now, not at the first save: a run started meanwhile sees the number in use.
            os.makedirs(self.run_dir, exist_ok=True)
        if stage == "fit":
            self._active, self._trained, self._signum, self._in_update = True, False, None, False
            self._stopping, self._saved_step, self.ignored_signals = False, None, 0
            self._distributed, self._rank = trainer.world_size > 1, trainer.global_rank
            if self.handle_signals and threading.current_thread() is threading.main_thread():
                self._connector = stop_signals.install(trainer, self._on_signal)
            self.peer_lost_line = None
            if self._distributed and self.peer_timeout_minutes is not None:
                self._watch_peers(trainer)

    def _watch_peers(self, trainer: L.Trainer) -> None:
        """The process-group timeout, the heartbeat, and Lightning's child-process observer replaced
        (it SIGKILLs rank 0 within 5 s of a launched rank's death, before any checkpoint)."""
        timeout_s = 60.0 * float(self.peer_timeout_minutes or 0.0)
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return
        peer_watch.set_process_group_timeout(timeout_s)
        if self.handle_signals:
            peer_watch.stop_with_launcher()
        launched = stop_signals.launched_ranks(trainer)
        if launched:
            stop_signals.stand_down_child_observer(trainer)
        self._peers = peer_watch.PeerWatch(
            rank=trainer.global_rank, world_size=trainer.world_size, timeout_s=timeout_s, launched=launched
        )
        self._peers.start()
        self.rollback = RollbackPoint() if self.rollback_max_mb > 0 else None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trained = True
        self._last_save = time.monotonic()
        self._boundary_step = trainer.global_step

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._in_update = True
        if self.rollback is not None:
            self.rollback.take(trainer, pl_module)
            if self.rollback.nbytes > self.rollback_max_mb * 2**20:
                if trainer.is_global_zero:
                    mib = self.rollback.nbytes / 2**20
                    print(
                        f"fastlight: the state an update changes takes {mib:.0f} MiB,"
                        f" over PreemptionCheckpoint rollback_max_mb {self.rollback_max_mb:g}: not copied at"
                        " each update; a rank lost in the middle of an update leaves the checkpoint on disk"
                        " from before",
                        file=sys.stderr,
                        flush=True,
                    )
                self.rollback = None

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._in_update = False
        due = self.every_minutes is not None and time.monotonic() - self._last_save >= 60 * self.every_minutes
        signum, due = self._agree(trainer, due)
        self._boundary_step = trainer.global_step  # every rank completed this update (they agreed)
        if self._peers is not None:
            self._peers.note_progress(trainer.global_step)
        if signum:
            self._signum = signum
            raise Preempted(signum)
        if due:
            self._save(trainer)
            if self._signum is not None and not self._distributed:  # it came during the save
                raise Preempted(self._signum)

    def _agree(self, trainer: L.Trainer, due: bool) -> tuple[int, bool]:
        """The stop signal (0: none) and whether the timer save is due, agreed by all ranks in one
        all-reduce (max): a signal to any rank stops them all after this update, and all take part in
        a save that one rank's clock says is due (rank 0 writes; Lightning's save ends in a barrier)."""
        if not self._distributed:
            return self._signum or 0, due
        t0 = time.perf_counter()
        local = torch.tensor([self._signum or 0, int(due)], device=trainer.strategy.root_device)
        signum, any_due = (int(v) for v in trainer.strategy.reduce(local, reduce_op="max").tolist())
        self.agreements += 1
        self.agreement_seconds += time.perf_counter() - t0
        return signum, bool(any_due)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every_epoch:
            self._save(trainer)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A run that reaches its end mid-epoch (``max_steps``, ``max_time``) leaves its final state
        too: ModelCheckpoint's epoch-end ``last.ckpt`` may be many updates older."""
        self._save(trainer)

    def _save(self, trainer: L.Trainer) -> None:
        """Write the checkpoint (rank 0) with every rank: a write that fails on rank 0 raises a
        :class:`CheckpointWriteError` on every rank, which all then stop on, instead of leaving
        the others in the barrier that ends Lightning's save."""
        error: OSError | None = None
        written = False
        try:
            with saving():  # a stop signal meanwhile (also while Lightning gathers the state) waits
                trainer.save_checkpoint(self.run_ckpt_path, weights_only=False)  # a full resume point
            written = True
            if self.run_dir is not None and trainer.is_global_zero:  # only rank 0 writes the file
                self._point_stable_path()
        except OSError as e:
            error = (
                e
                if isinstance(e, CheckpointWriteError)
                else CheckpointWriteError(e.errno, write_error_line(self.ckpt_path, e))
            )
            if self._distributed and not written:
                trainer.strategy.barrier("fastlight.failed_save")  # the others wait in Lightning's
        if self._distributed:
            failed = torch.tensor([int(error is not None)], device=trainer.strategy.root_device)
            if int(trainer.strategy.reduce(failed, reduce_op="max").item()) and error is None:
                error = CheckpointWriteError(
                    errno.EIO, f"rank 0 could not save checkpoint {self.run_ckpt_path} (its line says why)"
                )
        if error is not None:
            raise error
        self.saves += 1
        self._saved_step = trainer.global_step
        self._last_save = time.monotonic()

    def _point_stable_path(self) -> None:
        """Make ``ckpt_path`` a second name of ``run_ckpt_path``, atomically (a link, then a rename).

        A hard link rather than a symlink: a symlink dangles once moved (``mv last.ckpt init.ckpt``)
        or once its run folder is deleted; a hard link is the file itself, and every save here
        writes a new file (:class:`~fastlight.checkpoints.AtomicCheckpointIO` renames over the old
        one), so the two names never share a half-written file.
        """
        stable, src = self.ckpt_path, self.run_ckpt_path
        folder = os.path.dirname(stable)
        if not self._stable_checked:
            self._stable_checked = True
            if os.path.isfile(stable) and os.stat(stable).st_nlink == 1 and not os.path.samefile(stable, src):
                # The only copy of another checkpoint (e.g. from before versioned folders): keep it.
                kept = f"{self.filename}-before-version_{self.version}.ckpt"
                os.replace(stable, os.path.join(folder, kept))
        tmp = os.path.join(folder, f".{self.filename}.ckpt.link-{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        try:
            try:
                os.link(src, tmp)
            except OSError:  # a filesystem without hard links: a copy
                shutil.copyfile(src, tmp)
            os.replace(tmp, stable)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)  # the previous stable file, if any, is unchanged
            raise

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if not self._active:  # not a fit (validate, test, predict), or this fit already stopped
            return
        if self._peers is not None and _collective_failure(exception):
            lost = self._peers.wait_for_loss() or self._peers.behind()
            if lost:
                self._stop_without(trainer, exception, lost)
                return
        self._active = False
        self._stopping = True  # from here, stop signals are counted and ignored until the fit ends
        # Stops agreed by every rank, which then exit together: Lightning's observer would SIGKILL
        # this rank 0 as soon as another one exits with the agreed non-zero code.
        agreed = self._distributed and isinstance(exception, Preempted | CheckpointWriteError)
        if agreed and trainer.is_global_zero:
            stop_signals.stand_down_child_observer(trainer)
        if isinstance(trainer.datamodule, StopsSampling):
            trainer.datamodule.stop()  # no sampler is restarted (nor samples) while this one stops
        if isinstance(exception, Preempted):
            what = f"stopped by {signal.Signals(exception.signum).name}"
        else:
            what = f"stopped by {type(exception).__name__}"
        if not self._trained:
            where = "before training started; no checkpoint written"
        elif isinstance(exception, CheckpointWriteError):  # the disk that refused it would refuse it again
            where = f"at global step {trainer.global_step}: {exception.strerror}"
        else:
            try:
                if self._saved_step != trainer.global_step:  # else this update is on disk already
                    self._save(trainer)
                where = (
                    f"at global step {trainer.global_step}; checkpoint saved to {self.ckpt_path} "
                    f"(resume with {self.resume_hint.format(path=self.ckpt_path)})"
                )
                if isinstance(exception, Preempted) and trainer.is_global_zero:
                    if exception.signum == stop_signals.slurm_requeue_signal(trainer):
                        where += "; " + stop_signals.slurm_requeue(trainer, self.run_ckpt_path)
            except CheckpointWriteError as e:
                where = f"at global step {trainer.global_step}; saving the checkpoint failed: {e.strerror}"
            except BaseException as e:  # noqa: BLE001 - the original error must still surface
                where = f"at global step {trainer.global_step}; saving the checkpoint failed: {e!r}"
        if isinstance(exception, CheckpointWriteError):
            exception.reported = True  # the command prints it once
        if trainer.is_global_zero:
            if agreed and stop_signals.launched_ranks(trainer):  # they stop too: say how they ended
                codes = stop_signals.wait_for_ranks(trainer, RANKS_EXIT_TIMEOUT_S)
                where += "; the ranks it launched exited " + ", ".join(str(code) for code in codes)
                if -signal.SIGKILL in codes:
                    where += f" (-9: killed, still running {RANKS_EXIT_TIMEOUT_S:g} s after the stop)"
            print(f"fastlight: {what} {where}", file=sys.stderr, flush=True)

    def _stop_without(self, trainer: L.Trainer, exception: BaseException, lost: dict[int, str]) -> None:
        """Stop after ``lost`` ranks are gone: no collective (each would fail, or wait a timeout), the
        lowest surviving rank writes the checkpoint of the last completed update, every survivor
        prints one line, rank 0 ends the ranks it launched."""
        assert self._peers is not None
        self._active = False
        self._stopping = True
        if isinstance(trainer.datamodule, StopsSampling):
            trainer.datamodule.stop()
        who = "; ".join(f"rank {k} {why}" for k, why in lost.items())
        writer = self._peers.writer(lost)
        step = trainer.global_step
        if not self._trained:
            where = "before training started; no checkpoint written"
        elif step != self._boundary_step and not self._can_roll_back():
            where = (
                f"during an update (global step {step}; the last completed update ended at step "
                f"{self._boundary_step}), which no checkpoint can hold: resume from the last one on disk, "
                f"{self.ckpt_path}, if any"
            )
        elif writer != self._rank:
            where = f"at global step {step}; rank {writer} writes the checkpoint of the last completed update"
        elif self._saved_step == self._boundary_step:
            where = f"at global step {step}; checkpoint already saved to {self.ckpt_path}"
        else:
            at = f"at global step {step}"
            if step != self._boundary_step:  # the update under way is rolled back
                at = f"during an update (global step {step}, rolled back to {self._boundary_step})"
            try:
                self._save_alone(trainer, rolled_back=step != self._boundary_step)
                where = (
                    f"{at}; checkpoint of the last completed update saved to "
                    f"{self.ckpt_path} (resume with {self.resume_hint.format(path=self.ckpt_path)}; it holds "
                    "the per-rank state of the surviving ranks only)"
                )
            except BaseException as e:  # noqa: BLE001 - the loss must still be reported
                where = f"{at}; saving the checkpoint failed: {e!r}"
        self._peers.close()
        for i, proc in enumerate(stop_signals.launched_ranks(trainer)):
            if self._rank + i + 1 in lost and proc.poll() is None:
                proc.kill()  # lost (stopped, hung): it would never exit by itself
        if stop_signals.launched_ranks(trainer):
            codes = stop_signals.wait_for_ranks(trainer, min(RANKS_EXIT_TIMEOUT_S, self._peers.timeout_s))
            where += "; the ranks it launched exited " + ", ".join(str(code) for code in codes)
        rank = f"rank {self._rank}: " if self._distributed else ""
        self.peer_lost_line = (
            f"fastlight: {rank}stopped: {who} ({type(exception).__name__} in a collective) {where}"
        )
        print(self.peer_lost_line, file=sys.stderr, flush=True)
        peer_watch.report_loss(self.peer_lost_line)

    def _can_roll_back(self) -> bool:
        return self.rollback is not None and self.rollback.step == self._boundary_step

    def _save_alone(self, trainer: L.Trainer, *, rolled_back: bool = False) -> None:
        """What ``Trainer.save_checkpoint`` does, on this rank only: no gather, no barrier, and the
        file written here whichever rank this is; ``rolled_back``: the update under way undone."""
        with saving(), rank_state.local_only():
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            if rolled_back:
                assert self.rollback is not None
                checkpoint = self.rollback.apply(checkpoint)
            trainer.strategy.checkpoint_io.save_checkpoint(checkpoint, self.run_ckpt_path)
        if self.run_dir is not None:
            self._point_stable_path()
        self.saves += 1
        self._saved_step = self._boundary_step

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        past = trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps
        if not self._trained and past:
            if trainer.is_global_zero:
                print(
                    f"fastlight: nothing to train: the checkpoint {trainer.ckpt_path} is at global step "
                    f"{trainer.global_step}, already at or past --trainer.max_steps {trainer.max_steps}; "
                    "raise --trainer.max_steps to train further",
                    file=sys.stderr,
                    flush=True,
                )
        elif self._signum is not None and trainer.is_global_zero:  # came after the last update
            print(
                f"fastlight: {signal.Signals(self._signum).name} arrived as training ended; the run "
                f"finished, checkpoint saved to {self.ckpt_path}",
                file=sys.stderr,
                flush=True,
            )

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._active = False
            if self._peers is not None:
                self._peers.close()
                self._peers = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"saves": self.saves}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.saves = int(state_dict.get("saves", 0))


def _collective_failure(exception: BaseException) -> bool:
    """An error a collective raises when a peer is gone: gloo's ``RuntimeError`` (connection closed,
    timed out) and torch.distributed's ``DistError`` family (its subclasses)."""
    return isinstance(exception, RuntimeError)
