"""``LostRankCheckpoint``: a rank that is lost stops the others with one line naming it, and the lowest
surviving rank writes the checkpoint of the last completed update.

A rank that is SIGKILLed, SIGSTOPped, hung, or whose node is gone leaves the others waiting in their
next collective. On every rank of a multi-rank ``fit`` this callback sets the process-group timeout to
``peer_timeout_minutes``, beats a heartbeat (:class:`~fastlight.ranks.peer_watch.PeerWatch`; Lightning's
child-process observer is stood down), and when a collective fails and a rank is named lost, stops
without another collective: the samplers end, the lowest
surviving rank writes the last completed update alone (its own per-rank state only) to
:class:`~fastlight.callbacks.preemption.PreemptionCheckpoint`'s file (which then stands aside:
:class:`~fastlight.callbacks.preemption.HandlesStop`), rank 0 ends the ranks it launched, and every
survivor prints one line; the ``fastlight`` command exits 1 without the traceback.

A loss in the middle of an update leaves the survivors with part of it applied, which no checkpoint
should hold: with ``rollback`` the survivor's checkpoint is set back to the update's start
(:class:`~fastlight.ranks.rollback.RollbackPoint`); without (the default) nothing is written and the line
names the checkpoint on disk. The ``fastlight`` CLI attaches this callback to every run.
"""

from __future__ import annotations

import sys
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from fastlight import lightning_compat, rank_state
from fastlight.callbacks.preemption import PreemptionCheckpoint
from fastlight.checkpoints import saving
from fastlight.data.protocols import StopsSampling
from fastlight.ranks import peer_watch
from fastlight.ranks.launcher import RANKS_EXIT_TIMEOUT_S, end_launched_ranks
from fastlight.ranks.rollback import RollbackPoint

__all__ = ["LostRankCheckpoint"]


class LostRankCheckpoint(Callback):
    """Name a lost rank and save the last completed update from the survivors (see the module docstring).

    Needs a :class:`~fastlight.callbacks.preemption.PreemptionCheckpoint` in the trainer (it writes
    that callback's file); does nothing in a single-process run.

    Args:
        peer_timeout_minutes: the process-group timeout and the bound on how long the survivors wait for
            a lost rank before they stop (a killed rank is seen within seconds); longer than the slowest
            checkpoint write, which the other ranks wait for. ``None``: Lightning's own timeout (30
            minutes), no heartbeat, and this callback does nothing.
        rollback: copy what an update changes (trainable parameters, buffers, optimizer and scheduler
            state) to the host at the start of EVERY update, so that a rank lost in the middle of one
            still leaves the checkpoint of the update before it. It costs one device-to-host copy of
            that state per update, and that much host memory (``python -m benchmarks.rollback_cost``).
            Off: a loss mid-update saves nothing new and the line names the checkpoint on disk to resume
            from.
    """

    def __init__(
        self,
        peer_timeout_minutes: float | None = peer_watch.DEFAULT_PEER_TIMEOUT_MINUTES,
        rollback: bool = False,
    ) -> None:
        if peer_timeout_minutes is not None and peer_timeout_minutes <= 0:
            raise ValueError(
                f"LostRankCheckpoint peer_timeout_minutes must be > 0 or null, got {peer_timeout_minutes}"
            )
        self.peer_timeout_minutes = peer_timeout_minutes
        self.rollback = rollback
        #: The state at the current update's start (``rollback=True``, several ranks).
        self.rollback_point: RollbackPoint | None = None
        #: The line of a stop after a lost rank (this rank's), once printed.
        self.peer_lost_line: str | None = None
        self._checkpoint: PreemptionCheckpoint | None = None
        self._peers: peer_watch.PeerWatch | None = None
        self._lost: dict[int, str] | None = None  # the verdict after this fit's exception
        self._trained = False
        self._boundary: int | None = None  # the global step at the end of the last completed update

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._lost, self._trained, self.peer_lost_line = None, False, None
        found = [cb for cb in trainer.callbacks if isinstance(cb, PreemptionCheckpoint)]
        if not found:
            raise ValueError(
                "LostRankCheckpoint writes PreemptionCheckpoint's file: add a "
                "fastlight.PreemptionCheckpoint to the trainer's callbacks"
            )
        self._checkpoint = found[0]
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if trainer.world_size < 2 or self.peer_timeout_minutes is None or not distributed:
            return
        timeout_s = 60.0 * self.peer_timeout_minutes
        peer_watch.set_process_group_timeout(timeout_s)
        launched = lightning_compat.launched_ranks(trainer)
        if launched:  # the heartbeat names a launched rank's death instead
            lightning_compat.stand_down_child_observer(trainer)
        self._peers = peer_watch.PeerWatch(
            rank=trainer.global_rank, world_size=trainer.world_size, timeout_s=timeout_s, launched=launched
        )
        self._peers.start()
        self.rollback_point = RollbackPoint() if self.rollback else None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trained = True
        self._boundary = trainer.global_step

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.rollback_point is not None:
            self.rollback_point.take(trainer, pl_module)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        # This rank got through every collective of the update, so every rank took part in them: the
        # update is complete on this rank, whichever rank is lost next.
        self._boundary = trainer.global_step
        if self._peers is not None:
            self._peers.note_progress(trainer.global_step)

    def handles_stop(self, trainer: L.Trainer, exception: BaseException) -> bool:
        """Whether ``exception`` is a collective failing because a rank is lost (the verdict is waited
        for once per fit: up to a few heartbeats, as a killed peer's connection closes first)."""
        if self._lost is None:
            # A peer that is gone fails a collective with gloo's RuntimeError or torch.distributed's
            # DistError family (its subclasses).
            collective = self._peers is not None and isinstance(exception, RuntimeError)
            self._lost = (self._peers.wait_for_loss() or self._peers.behind()) if collective else {}
        return bool(self._lost)

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if self.peer_lost_line is not None or not self.handles_stop(trainer, exception):
            return
        assert self._peers is not None and self._lost is not None
        if isinstance(trainer.datamodule, StopsSampling):
            trainer.datamodule.stop()
        lost, rank = self._lost, trainer.global_rank
        where = self._save(trainer, writer=self._peers.writer(lost))
        self._peers.close()
        timeout = min(RANKS_EXIT_TIMEOUT_S, self._peers.timeout_s)
        where += end_launched_ranks(trainer, lost=lost, timeout=timeout)
        who = "; ".join(f"rank {k} {why}" for k, why in lost.items())
        self.peer_lost_line = (
            f"fastlight: rank {rank}: stopped: {who} ({type(exception).__name__} in a collective) {where}"
        )
        print(self.peer_lost_line, file=sys.stderr, flush=True)
        peer_watch.report_loss(self.peer_lost_line)

    def _save(self, trainer: L.Trainer, writer: int | None) -> str:
        """The survivors' checkpoint, written by ``writer`` alone; returns where it is, for the line."""
        assert self._checkpoint is not None
        ckpt, step, boundary = self._checkpoint, trainer.global_step, self._boundary
        rolled_back = step != boundary
        if not self._trained:
            return "before training started; no checkpoint written"
        if rolled_back and (self.rollback_point is None or self.rollback_point.step != boundary):
            on_disk = f"at global step {ckpt.saved_step}" if ckpt.saved_step is not None else "if any"
            return (
                f"during an update (global step {step}; the last completed update ended at step {boundary}): "
                "not saved, as this rank holds part of that update and no copy of its start "
                f"(LostRankCheckpoint rollback: false); resume from the last checkpoint on disk, "
                f"{ckpt.ckpt_path} ({on_disk})"
            )
        if writer != trainer.global_rank:
            return f"at global step {step}; rank {writer} writes the checkpoint of the last completed update"
        if ckpt.saved_step == boundary:
            return f"at global step {step}; checkpoint already saved to {ckpt.ckpt_path}"
        at = f"at global step {step}"
        if rolled_back:
            at = f"during an update (global step {step}, rolled back to {boundary})"
        try:
            with saving(), rank_state.local_only():  # no gather of the others' per-rank state
                checkpoint = lightning_compat.dump_checkpoint(trainer)
                if rolled_back:
                    assert self.rollback_point is not None
                    checkpoint = self.rollback_point.apply(checkpoint)
                ckpt.write_alone(trainer, checkpoint)
        except BaseException as e:  # noqa: BLE001 - the loss must still be reported
            return f"{at}; saving the checkpoint failed: {e!r}"
        hint = ckpt.resume_hint.format(path=ckpt.ckpt_path)
        return (
            f"{at}; checkpoint of the last completed update saved to {ckpt.ckpt_path} (resume with {hint}; "
            "it holds the per-rank state of the surviving ranks only)"
        )

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and self._peers is not None:
            self._peers.close()
            self._peers = None
