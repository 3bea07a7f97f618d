"""``PreemptionCheckpoint``: a run that is stopped or fails leaves a checkpoint to resume from.

SLURM and Kubernetes send SIGTERM before they preempt a job (SLURM's requeue signal is often
SIGUSR1), and a person stops a run with Ctrl-C (SIGINT). Lightning alone stops after the batch on
SIGTERM and exits 0 without a checkpoint, and turns SIGINT into a KeyboardInterrupt wherever the
main thread happens to be, in the middle of an optimizer step included. This callback:

- handles SIGTERM, SIGINT and SIGUSR1 during ``fit``: outside an update (e.g. while the trainer
  waits for a rollout) it stops at once; during one, right after it, so a checkpoint never holds a
  half-applied update;
- on any exception during training (a signal, a sampler fault, an env's non-finite value) writes
  ``<dirpath>/<filename>.ckpt`` before the process exits, and prints one line saying what
  happened and where the checkpoint is;
- exits with the signal's conventional code, 128 + signum (SIGINT 130, SIGTERM 143, SIGUSR1 138),
  so schedulers and shells see that the run did not finish;
- also saves every ``every_minutes`` of training (bounding the work a SIGKILL or power cut can
  lose), and when training ends;
- says so when a resumed checkpoint is already at ``--trainer.max_steps`` (nothing to train).

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
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

#: The signals that stop a run with a checkpoint.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


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
        handle_signals: install the signal handlers (off: only exceptions and the timer save).
        version: this run's folder, ``<dirpath>/version_<version>``, which holds the files it writes;
            ``<dirpath>/<filename>.ckpt`` is then the newest of them, under a second name (see the
            module docstring). ``None``: the file is written at ``<dirpath>/<filename>.ckpt`` itself.
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
        self._previous: dict[int, Any] = {}
        self._active = False  # handlers act only while a fit is running
        self._trained = False  # on_train_start ran in this fit
        self._in_update = False
        self._signum: int | None = None
        self._last_save = time.monotonic()

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
    def _install(self) -> None:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return
        for sig in STOP_SIGNALS:
            current = signal.getsignal(sig)
            if current != self._on_signal:
                self._previous[sig] = current
            signal.signal(sig, self._on_signal)

    def _restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._previous.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self._active:  # re-installed by Lightning's signal teardown after the fit: stand aside
            previous = self._previous.get(signum, signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:  # the default action (terminate), as if never installed
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return
        if self._signum is not None:  # a second signal while stopping: the first one is being handled
            return
        self._signum = signum
        if not self._in_update:
            raise Preempted(signum)
        # Inside an update: finish it, then stop in on_train_batch_end.

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
            self._install()  # Lightning composes its own SIGTERM handler with this one later

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trained = True
        self._last_save = time.monotonic()

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._in_update = True

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._in_update = False
        if self._signum is not None:
            raise Preempted(self._signum)
        due = self.every_minutes is not None and time.monotonic() - self._last_save >= 60 * self.every_minutes
        if due:
            self._save(trainer)

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
        trainer.save_checkpoint(self.run_ckpt_path, weights_only=False)  # a full resume point
        if self.run_dir is not None and trainer.is_global_zero:  # only rank 0 writes the file
            self._point_stable_path()
        self.saves += 1
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
        self._active = False
        if isinstance(exception, Preempted):
            what = f"stopped by {signal.Signals(exception.signum).name}"
        else:
            what = f"stopped by {type(exception).__name__}"
        if not self._trained:
            where = "before training started; no checkpoint written"
        else:
            try:
                self._save(trainer)
                where = (
                    f"at global step {trainer.global_step}; checkpoint saved to {self.ckpt_path} "
                    f"(resume with {self.resume_hint.format(path=self.ckpt_path)})"
                )
            except Exception as e:  # noqa: BLE001 - the original error must still surface
                where = f"at global step {trainer.global_step}; saving the checkpoint failed: {e}"
        if trainer.is_global_zero:
            print(f"fastlight: {what} {where}", file=sys.stderr, flush=True)
        self._restore()

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

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._active = False
            self._restore()

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"saves": self.saves}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.saves = int(state_dict.get("saves", 0))
