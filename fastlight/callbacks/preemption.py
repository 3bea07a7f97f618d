"""``PreemptionCheckpoint``: a run that is stopped or fails leaves a checkpoint to resume from.

Lightning alone exits 0 without a checkpoint on SIGTERM and deadlocks under DDP on a SIGTERM to a rank
other than 0 (:mod:`fastlight.lightning_compat`). Instead this callback:

- notes a stop signal during ``fit`` without entering a collective; ranks agree at each update's end,
  in one all-reduce, on whether any was signalled (or the timer save is due), and stop after the same
  update: a checkpoint never holds half an update;
- on any exception during training ends the samplers, writes ``<dirpath>/<filename>.ckpt`` (rank 0
  writes, every rank takes part), prints one line saying what happened and where the checkpoint is,
  and exits with 128 + signum on every rank (SIGINT 130, SIGTERM 143, SIGUSR1 138); under SLURM with
  auto-requeue it requeues the job (:mod:`fastlight.ranks.slurm`);
- saves every ``every_minutes`` of training and when training ends; a file that cannot be written
  stops every rank with one line naming the last good checkpoint (:class:`CheckpointWriteError`).

A lost rank is :class:`~fastlight.callbacks.lost_rank.LostRankCheckpoint`'s. This callback is the only
writer of ``<default_root_dir>/checkpoints/last.ckpt``. With ``version=N`` the run writes
``<dirpath>/version_N/<filename>.ckpt``; the stable path becomes a second name of it
(:mod:`fastlight.checkpoint_link`) once this run has trained as far as the checkpoint it named when
the run began. A run that completes no update writes nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol, runtime_checkable

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from fastlight import lightning_compat
from fastlight.callbacks.timed_checkpoint import SaveClock, max_over_ranks
from fastlight.checkpoint_link import link_as
from fastlight.checkpoints import CheckpointWriteError, save_in_progress, saving, write_error_line
from fastlight.data.protocols import StopsSampling
from fastlight.log_writes import LogWriteError
from fastlight.ranks.launcher import end_launched_ranks, stop_with_launcher
from fastlight.ranks.slurm import slurm_requeue
from fastlight.safe_files import safe_load

__all__ = ["HandlesStop", "Preempted", "PreemptionCheckpoint"]


class Preempted(SystemExit):
    """Raised in the trainer when a stop signal arrives; exits the process with 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + int(signum))
        self.signum = int(signum)


@runtime_checkable
class HandlesStop(Protocol):
    """A callback that takes over the stop after an exception (LostRankCheckpoint after a lost rank)."""

    def handles_stop(self, trainer: L.Trainer, exception: BaseException) -> bool: ...


class PreemptionCheckpoint(Callback):
    """Checkpoint on SIGTERM / SIGINT / SIGUSR1, on any training exception, and every N minutes.

    Args:
        dirpath: folder of the checkpoint; ``None`` = ``<default_root_dir>/checkpoints``.
        filename: checkpoint name without ``.ckpt``.
        every_minutes: also save every this many minutes of training; ``None`` disables.
        handle_signals: install the signal handlers (off: Lightning's own SIGTERM handling, unsafe under DDP).
        version: this run's folder is ``<dirpath>/version_<version>``, and ``<dirpath>/<filename>.ckpt``
            a second name of its file; ``None``: the file is ``<dirpath>/<filename>.ckpt`` itself.
        every_epoch: also save at the end of every training epoch.
    """

    def __init__(
        self,
        dirpath: str | None = None,
        filename: str = "last",
        every_minutes: float | None = 30.0,
        handle_signals: bool = True,
        version: int | None = None,
        every_epoch: bool = False,
    ) -> None:
        if every_minutes is not None and every_minutes <= 0:
            raise ValueError(f"PreemptionCheckpoint every_minutes must be > 0 or null, got {every_minutes}")
        if not filename:
            raise ValueError("PreemptionCheckpoint filename must not be empty")
        if version is not None and version < 0:
            raise ValueError(f"PreemptionCheckpoint version must be >= 0 or null, got {version}")
        self.dirpath, self.filename, self.version = dirpath, filename, version
        self.every_minutes, self.every_epoch, self.handle_signals = every_minutes, every_epoch, handle_signals
        self.saves = 0  # checkpoints this callback wrote
        self.saved_step: int | None = None  # the global step of this fit's last checkpoint
        #: How the stop line says to resume ``{path}``; the ``fastlight`` command sets its ``--ckpt_path``.
        self.resume_hint = "trainer.fit(..., ckpt_path={path!r})"
        #: The command's own line for a refused setting (``None``: not one), left to say a refusal found
        #: before training started. The command sets it.
        self.refusal: Callable[[BaseException], str | None] | None = None
        self.ignored_signals = 0  # stop signals that came after the first one of this fit
        self._active, self._trained = False, False  # a fit is running (setup .. teardown); it trained
        self._in_update = False
        self._distributed, self._rank = False, 0  # several ranks: a signal only sets the flag, they agree
        self._signum: int | None = None  # the stop signal of this fit (the first one, or the agreed one)
        self._stopping = False  # the stop has begun (its checkpoint is being written, or is written)
        self._stable_checked = False  # the file found at ckpt_path before this run's first save
        self._floor: int | None = None  # the global step of ckpt_path's checkpoint (-1: none, or this run's)
        self._updates = 0  # updates completed in this fit
        self.clock = SaveClock(every_minutes)

    @property
    def ckpt_path(self) -> str:
        """The stable path to resume from: the newest checkpoint (of the latest run, with ``version``)."""
        return os.path.join(self.dirpath or "checkpoints", f"{self.filename}.ckpt")

    @property
    def run_ckpt_path(self) -> str:
        """The file this run writes: ``<dirpath>/version_<version>/<filename>.ckpt``, else ``ckpt_path``."""
        if self.version is None or "://" in self.ckpt_path:
            return self.ckpt_path
        return os.path.join(self.dirpath or "checkpoints", f"version_{self.version}", f"{self.filename}.ckpt")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Notes the signal, enters no collective; raises only where one process can stop at once."""
        if self._signum is not None or self._stopping:
            self.ignored_signals += 1
            rank, n = f"rank {self._rank}: " if self._distributed else "", self.ignored_signals + 1
            line = f"fastlight: {rank}{signal.Signals(signum).name} ignored (stop signal {n}): the run stops"
            line += " once its checkpoint is on disk; SIGKILL stops it at once, without one\n"
            with contextlib.suppress(OSError):  # not print: the handler may run inside a print
                os.write(2, line.encode())
            return
        self._signum = signum
        if self._distributed or self._in_update or save_in_progress():
            return  # at the end of the update (all ranks together), or once the file is on disk
        raise Preempted(signum)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.dirpath = self.dirpath or os.path.join(trainer.default_root_dir, "checkpoints")
        if stage != "fit":
            return
        if self.run_ckpt_path != self.ckpt_path and trainer.is_global_zero:
            # Taken now, not at the first save: a run started meanwhile sees the number in use.
            os.makedirs(os.path.dirname(self.run_ckpt_path), exist_ok=True)
        self._active, self._trained, self._signum, self._in_update = True, False, None, False
        self._stopping, self.saved_step, self.ignored_signals = False, None, 0
        self._updates, self._floor = 0, None
        self._distributed, self._rank = trainer.world_size > 1, trainer.global_rank
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            lightning_compat.install_stop_handler(trainer, self._on_signal)
            if self._distributed:
                stop_with_launcher()

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trained = True
        self.clock = SaveClock(self.every_minutes)
        self.clock.start()

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._in_update = True

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._in_update = False
        self._updates += 1
        # Agreed by all ranks: a signal to any rank stops all; a save one clock calls due is made by all.
        signum, due = max_over_ranks(trainer, self._signum or 0, int(self.clock.due()))
        if signum:
            self._signum = signum
            raise Preempted(signum)
        if due:
            self._save(trainer)
            if self._signum is not None and not self._distributed:  # it came during the save
                raise Preempted(self._signum)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every_epoch:
            self._save(trainer)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The final state, also mid-epoch (``max_steps``, ``max_time``); nothing without an update."""
        if not self._updates:
            return
        self._save(trainer)
        if self.resume_path != self.ckpt_path and trainer.is_global_zero:
            _say(
                f"{self.ckpt_path} still names a longer run's checkpoint (global step "
                f"{self._floor}, this run's {trainer.global_step}); this run's is {self.resume_path}"
            )

    def _save(self, trainer: L.Trainer) -> None:
        """Write the checkpoint with every rank; a failed write raises a CheckpointWriteError on all."""
        error: OSError | None = None
        written = False  # the file is on disk (rank 0) or the state was sent (the others)
        try:
            with saving():  # a stop signal meanwhile (also while Lightning gathers the state) waits
                trainer.save_checkpoint(self.run_ckpt_path, weights_only=False)  # a full resume point
            written = True
            if trainer.is_global_zero:  # only rank 0 writes the file
                self._point_stable_path(trainer.global_step)
        except OSError as e:
            error = e
            if not isinstance(e, CheckpointWriteError):
                error = CheckpointWriteError(e.errno, write_error_line(self.ckpt_path, e))
            if self._distributed and not written:
                trainer.strategy.barrier("fastlight.failed_save")  # the others wait in Lightning's
        if self._distributed and max_over_ranks(trainer, int(error is not None))[0] and error is None:
            why = f"rank 0 could not save checkpoint {self.run_ckpt_path} (its line says why)"
            error = CheckpointWriteError(errno.EIO, why)
        if error is not None:
            raise error
        self.saves += 1
        self.saved_step = trainer.global_step
        self.clock.saved()

    def _point_stable_path(self, step: int) -> None:
        """Make ``ckpt_path`` a second name of ``run_ckpt_path`` once this run (at ``step``) is as far."""
        if self.run_ckpt_path == self.ckpt_path:
            return
        if self._floor is None:
            self._floor = checkpoint_step(self.ckpt_path, unless=self.run_ckpt_path)
        if step < self._floor:
            return
        keep = None if self._stable_checked else f"{self.filename}-before-version_{self.version}.ckpt"
        self._stable_checked = True  # only a file found before this run's first save is kept
        link_as(self.run_ckpt_path, self.ckpt_path, keep_as=keep)

    @property
    def resume_path(self) -> str:
        """The newest checkpoint of this fit: ``ckpt_path`` unless a longer run's file still holds it."""
        moved = self._floor is None or (self.saved_step is not None and self.saved_step >= self._floor)
        return self.ckpt_path if moved else self.run_ckpt_path

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if not self._active:  # not a fit (validate, test, predict), or this fit already stopped or ended
            self._report_final_log_error(trainer, exception)
            return
        self._active = False
        self._stopping = True  # from here, stop signals are counted and ignored until the fit ends
        others = (cb for cb in trainer.callbacks if cb is not self and isinstance(cb, HandlesStop))
        if any(cb.handles_stop(trainer, exception) for cb in others):
            return
        # Every rank exits with the agreed code: Lightning's observer would SIGKILL rank 0 at the first.
        agreed = self._distributed and isinstance(exception, Preempted | CheckpointWriteError)
        if agreed and trainer.is_global_zero:
            lightning_compat.stand_down_child_observer(trainer)
        if isinstance(trainer.datamodule, StopsSampling):
            trainer.datamodule.stop()  # no sampler is restarted (nor samples) while this one stops
        if not self._trained and self.refusal is not None and self.refusal(exception) is not None:
            return
        what = signal.Signals(exception.signum).name if isinstance(exception, Preempted) else None
        what, at = what or type(exception).__name__, f"at global step {trainer.global_step}"
        # Any error but a signal, a full disk or a failed log write: its first line said, its traceback kept.
        plain = not isinstance(exception, Preempted | CheckpointWriteError | LogWriteError)
        said = f": {exception.strerror}" if isinstance(exception, LogWriteError) else ""
        if plain and str(exception).strip():
            said = f": {str(exception).strip().splitlines()[0]}"
        if not self._trained:
            where = f"before training started{said}; no checkpoint written"
        elif not self._updates:  # nothing a new start (or the checkpoint resumed) does not give
            where = f"{at} before this run's first update{said}; no checkpoint written"
        elif isinstance(exception, CheckpointWriteError):  # the disk that refused it would refuse it again
            where = f"{at}: {exception.strerror}"
        else:
            try:
                if self.saved_step != trainer.global_step:  # else this update is on disk already
                    self._save(trainer)
                hint = self.resume_hint.format(path=self.resume_path)
                where = f"{at}{said}; checkpoint saved to {self.resume_path} (resume with {hint})"
                if isinstance(exception, Preempted) and trainer.is_global_zero:
                    if exception.signum == lightning_compat.slurm_requeue_signal(trainer):
                        where += "; " + slurm_requeue(trainer, self.run_ckpt_path)
            except BaseException as e:  # noqa: BLE001 - the original error must still surface
                why = e.strerror if isinstance(e, CheckpointWriteError) else repr(e)
                where = f"{at}{said}; saving the checkpoint failed: {why}"
        if isinstance(exception, CheckpointWriteError | LogWriteError):
            exception.reported = True  # the command prints it once
        if trainer.is_global_zero:
            where += end_launched_ranks(trainer) if agreed else ""  # they stop too: say how they ended
            if plain and (kept := self._keep_traceback(exception)):
                where += f"; traceback in {kept}"
            _say(f"stopped by {what} {where}")
            global _reported
            _reported = exception

    def _keep_traceback(self, exception: BaseException) -> str | None:
        """Write ``exception``'s traceback beside this run's checkpoint (the terminal gets one line)."""
        path = os.path.join(os.path.dirname(self.run_ckpt_path), "traceback.txt")
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write("".join(traceback.format_exception(exception)))
        except OSError:
            return None
        return path

    def _report_final_log_error(self, trainer: L.Trainer, exception: BaseException) -> None:
        """A logger's last flush failed (Lightning finalizes the loggers after training has ended)."""
        if not isinstance(exception, LogWriteError) or exception.reported or self.saved_step is None:
            return
        exception.reported = True  # the command prints it once
        if trainer.is_global_zero:
            line = (
                f"training finished at global step {self.saved_step}, checkpoint saved to {self.resume_path}"
            )
            _say(f"{line}; then {exception.strerror}")

    def write_alone(self, trainer: L.Trainer, checkpoint: dict[str, Any]) -> None:
        """Write ``checkpoint`` from this rank alone, no gather, no barrier (the survivors' save)."""
        with saving():
            trainer.strategy.checkpoint_io.save_checkpoint(checkpoint, self.run_ckpt_path)
        self._point_stable_path(int(checkpoint["global_step"]))
        self.saves += 1
        self.saved_step = int(checkpoint["global_step"])

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        past = trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps
        line, step = None, trainer.global_step
        if not self._trained and past:
            line = (
                f"nothing to train: the checkpoint {trainer.ckpt_path} is at global step {step}, already at "
                f"or past --trainer.max_steps {trainer.max_steps}; raise --trainer.max_steps to train further"
            )
        elif self._signum is not None:  # came after the last update
            line = f"{signal.Signals(self._signum).name} arrived as training ended; the run finished, "
            line += f"checkpoint saved to {self.resume_path}"
        if line is not None and trainer.is_global_zero:
            _say(line)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._active = False

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"saves": self.saves}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.saves = int(state_dict.get("saves", 0))


#: The exception whose stop line this process printed (rank 0), for :func:`stop_reported`.
_reported: BaseException | None = None


def _say(line: str) -> None:
    print(f"fastlight: {line}", file=sys.stderr, flush=True)


def stop_reported(error: BaseException) -> bool:
    """Whether ``error`` ended a fit whose one-line stop was printed (the command exits 1, no traceback)."""
    return _reported is not None and error is _reported


def checkpoint_step(path: str, *, unless: str) -> int:
    """The global step of the checkpoint at ``path``; -1 when none, ``unless`` itself, or unreadable."""
    if not os.path.isfile(path) or (os.path.exists(unless) and os.path.samefile(path, unless)):
        return -1
    try:  # mmap: the tensors are not read
        return int(safe_load(path, flag="--ckpt_path", mmap=True).get("global_step", -1))
    except Exception:  # noqa: BLE001 - an unreadable file is replaced (and kept), as before
        return -1
