"""Every use of a private Lightning API in fastlight, in one module.

Each one here is used because no public API does the job; :data:`CHECKED` is the release range they were
checked against (tests/test_compat.py fails once the installed Lightning leaves it). After an upgrade,
re-read this list; tests/faults/test_preemption.py, test_ddp_stop.py and test_lost_rank.py exercise the
names defined here. Used in place:

- ``LightningCLI._instantiate_trainer``, ``_parse_ckpt_path`` and ``_get``: ``fastlight.cli.FastlightCLI``;
- ``TQDMProgressBar._train_progress_bar`` and ``_should_update``: ``RolloutProgressBar``;
- ``LightningModule._trainer``: whether a module is attached to a Trainer (``trainer`` raises when not).

Defined here:

- ``signal_connector._SignalConnector`` (``_original_handlers``, ``_get_current_signal_handlers``,
  ``_register_signal``) as ``Trainer._signal_connector``: :class:`StopSignalConnector`. Lightning's
  SIGTERM handler enters ``dist.broadcast`` from inside the handler on whatever rank received it, which
  deadlocks a rank other than 0 (and its SLURM SIGUSR1 handler saves, with a barrier, there too). The
  subclass registers one handler that enters no collective for every stop signal;
  ``Trainer.received_sigterm`` stays False, so Lightning's loops never stop one rank alone.
- ``Trainer._accelerator_connector.cluster_environment``: the SLURM environment and its requeue signal.
- ``Trainer._logger_connector.log_metrics``: :func:`log_once`.
- ``Trainer._checkpoint_connector.hpc_save_path``: the ``hpc_ckpt_N.ckpt`` a requeued SLURM job resumes from.
- ``Trainer._checkpoint_connector.dump_checkpoint``: the full checkpoint dict made on this rank alone
  (``Trainer.save_checkpoint`` ends in a barrier a rank whose peer is lost cannot enter).
- ``_SubprocessScriptLauncher.procs``: the ranks Lightning's launcher started on this node.
- ``_ChildProcessObserver._child_processes``: the launcher's thread that SIGKILLs rank 0 within 5 s of
  another rank's non-zero exit; :func:`stand_down_child_observer` empties its list.
- ``ModelParallelStrategy._save_distributed_checkpoint``: :func:`save_sharded`.
- ``LightningModule._hparams`` and ``_hparams_initial``: :func:`record_hparams`.
"""

from __future__ import annotations

import copy
import subprocess
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

from fastlight.procs import STOP_SIGNALS

#: The Lightning releases the touches above were checked against: ``low <= version < high``.
CHECKED = ("2.6.0", "2.7")
Handler = Callable[[int, FrameType | None], Any]


def record_hparams(module: L.LightningModule, values: dict[str, Any]) -> None:
    """Set hparams ``values`` where checkpoints (``_hparams``) and loggers (``_hparams_initial``) look."""
    module._hparams.update(values)
    module._hparams_initial.update(copy.deepcopy(values))


def slurm_requeue_signal(trainer: L.Trainer) -> int | None:
    """The requeue signal of a SLURM run with auto-requeue (Lightning's default: SIGUSR1), else None."""
    env = trainer._accelerator_connector.cluster_environment
    if isinstance(env, SLURMEnvironment) and env.auto_requeue and env.requeue_signal is not None:
        return int(env.requeue_signal)
    return None


def hpc_save_path(trainer: L.Trainer) -> str:
    """The next ``<default_root_dir>/hpc_ckpt_N.ckpt``: where Lightning resumes a requeued SLURM job from."""
    return trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir)


def log_once(trainer: L.Trainer, metrics: dict[str, float]) -> None:
    """Log ``metrics`` at this update's logger step only, and make them the latest callback metrics
    (``LightningModule.log`` from a callback would log them again at every later step of the epoch)."""
    values = {k: torch.tensor(float(v)) for k, v in metrics.items()}
    trainer.callback_metrics.update(values)
    trainer._logger_connector.log_metrics(values)


def dump_checkpoint(trainer: L.Trainer) -> dict[str, Any]:
    """The full checkpoint as ``Trainer.save_checkpoint`` would write it, made on this rank only."""
    return trainer._checkpoint_connector.dump_checkpoint(weights_only=False)


def save_sharded(trainer: L.Trainer, path: str) -> None:
    """``Trainer.save_checkpoint(path)`` as under ``save_distributed_checkpoint=True``: every rank writes
    its own shards, then rank 0 Lightning's ``meta.pt``, then all meet in a barrier."""
    strategy = trainer.strategy
    before = strategy._save_distributed_checkpoint
    strategy._save_distributed_checkpoint = True
    try:
        trainer.save_checkpoint(path, weights_only=False)
    finally:
        strategy._save_distributed_checkpoint = before


class StopSignalConnector(_SignalConnector):
    """Lightning's signal connector with one ``handler`` for every stop signal (module docstring).
    Lightning's ``teardown`` puts the process's handlers back; registering twice changes nothing."""

    def __init__(self, trainer: L.Trainer, handler: Handler) -> None:
        super().__init__(trainer)
        self.handler = handler
        self.registered = False

    def signals(self) -> tuple[int, ...]:
        requeue = slurm_requeue_signal(self.trainer)
        return tuple(dict.fromkeys((*STOP_SIGNALS, *([requeue] if requeue is not None else []))))

    def register_signal_handlers(self) -> None:
        if self.registered:
            return
        self.received_sigterm = False
        self._original_handlers = self._get_current_signal_handlers()
        for sig in self.signals():
            self._register_signal(sig, self.handler)
        self.registered = True

    def teardown(self) -> None:
        super().teardown()
        self.registered = False


def install_stop_handler(trainer: L.Trainer, handler: Handler) -> StopSignalConnector:
    """Put a :class:`StopSignalConnector` in Lightning's place for this fit and register it now."""
    connector = StopSignalConnector(trainer, handler)
    trainer._signal_connector = connector
    connector.register_signal_handlers()
    return connector


def launched_ranks(trainer: L.Trainer) -> list[subprocess.Popen]:
    """The ranks this process started (Lightning's script launcher on a node's local rank 0)."""
    launcher = trainer.strategy.launcher
    return list(launcher.procs) if isinstance(launcher, _SubprocessScriptLauncher) else []


def stand_down_child_observer(trainer: L.Trainer) -> None:
    """Stop Lightning's observer of the launched ranks from SIGKILLing this process (module docstring)."""
    launcher = trainer.strategy.launcher
    if not isinstance(launcher, _SubprocessScriptLauncher) or not launcher.procs:
        return
    for thread in threading.enumerate():
        # The observer was given the launcher's own list of processes.
        if isinstance(thread, _ChildProcessObserver) and thread._child_processes is launcher.procs:
            thread._child_processes = []
