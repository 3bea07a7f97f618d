"""``LostRankCheckpoint``: a rank that is lost stops the others with one line naming it, and the lowest
surviving rank writes the checkpoint of the last completed update.

On every rank of a multi-rank ``fit`` this callback sets the process-group timeout to
``peer_timeout_minutes`` and beats a heartbeat (:class:`~fastlight.ranks.peer_watch.PeerWatch`). When a
rank is named lost, the survivors stop without another collective: the lowest surviving rank writes the
last completed update alone (its own per-rank state only) to ``PreemptionCheckpoint``'s file, and every
survivor prints one line. A loss mid-update is set back to the update's start with ``rollback``
(:class:`~fastlight.ranks.rollback.RollbackPoint`); without it nothing is written.

Under ``--trainer.strategy fsdp2`` no rank holds the whole model, so every ``sharded_every_minutes`` all
ranks write a sharded checkpoint together (:func:`~fastlight.lightning_compat.save_sharded`) to
``<run folder>/sharded-step=<S>``, complete once Lightning's ``meta.pt`` is in it, and the previous one
is removed; after a lost rank the line names the last complete one and how many updates are lost.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import ModelParallelStrategy
from typing_extensions import override

from fastlight import lightning_compat, rank_state
from fastlight.callbacks.preemption import PreemptionCheckpoint
from fastlight.callbacks.timed_checkpoint import SaveClock, max_over_ranks
from fastlight.checkpoints import saving
from fastlight.data.protocols import RolloutPolicyModule, StopsSampling
from fastlight.ranks import peer_watch
from fastlight.ranks.launcher import RANKS_EXIT_TIMEOUT_S, end_launched_ranks
from fastlight.ranks.rollback import RollbackPoint

__all__ = ["LostRankCheckpoint"]

#: Minutes between two sharded checkpoints under ``fsdp2``.
SHARDED_EVERY_MINUTES = 5.0


class LostRankCheckpoint(Callback):
    """Name a lost rank and save the last completed update from the survivors (see the module docstring).

    Needs a :class:`~fastlight.callbacks.preemption.PreemptionCheckpoint` in the trainer (it writes
    that callback's file); does nothing in a single-process run.

    Args:
        peer_timeout_minutes: the process-group timeout, and how long the survivors wait for a lost rank;
            longer than the slowest checkpoint write. ``None``: Lightning's timeout, and this does nothing.
        rollback: copy what an update changes to the host at the start of EVERY update, so a rank lost
            mid-update still leaves the update before it. Off: a loss mid-update saves nothing new.
        sharded_every_minutes: under ``--trainer.strategy fsdp2`` (several ranks), training wall-clock
            between two sharded checkpoints (at most this much is lost with a rank); ``None``: none.
    """

    def __init__(
        self,
        peer_timeout_minutes: float | None = peer_watch.DEFAULT_PEER_TIMEOUT_MINUTES,
        rollback: bool = False,
        sharded_every_minutes: float | None = SHARDED_EVERY_MINUTES,
    ) -> None:
        for name, value in (
            ("peer_timeout_minutes", peer_timeout_minutes),
            ("sharded_every_minutes", sharded_every_minutes),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"LostRankCheckpoint {name} must be > 0 or null, got {value}")
        self.peer_timeout_minutes = peer_timeout_minutes
        self.rollback, self.sharded_every_minutes = rollback, sharded_every_minutes
        self.clock = SaveClock(None)  # the sharded checkpoints' (fsdp2 only)
        #: This fit's last complete sharded checkpoint, and its last whole one (PreemptionCheckpoint's):
        #: (global step, updates of this fit, policy version, path).
        self.sharded: tuple[int, int, int, str] | None = None
        self._whole: tuple[int, int, int, str] | None = None
        self._updates = 0  # updates completed in this fit
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
        sharded = (
            distributed and trainer.world_size > 1 and isinstance(trainer.strategy, ModelParallelStrategy)
        )
        self.clock = SaveClock(self.sharded_every_minutes if sharded else None)
        self.sharded = self._whole = None
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
        self._trained, self._updates = True, 0
        self._boundary = trainer.global_step
        self.clock.start()

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.rollback_point is not None:
            self.rollback_point.take(trainer, pl_module)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        # This rank got through every collective of the update: it is complete, whichever rank is lost next.
        self._boundary = trainer.global_step
        self._updates += 1
        if self._peers is not None:
            self._peers.note_progress(trainer.global_step)
        if self.clock.every_s is None:
            return
        ckpt, step = self._checkpoint, trainer.global_step
        # A plain Lightning module counts no policy versions: its updates stand in for them.
        version = pl_module.policy_version if isinstance(pl_module, RolloutPolicyModule) else self._updates
        if ckpt is not None and ckpt.saved_step == step:  # PreemptionCheckpoint saved this update
            self._whole = (step, self._updates, version, ckpt.resume_path)
        if max_over_ranks(trainer, self.clock.due())[0]:
            assert ckpt is not None
            path = os.path.join(os.path.dirname(ckpt.run_ckpt_path), f"sharded-step={step}")
            with saving():
                lightning_compat.save_sharded(trainer, path)  # returns once every rank's part is on disk
            previous, self.sharded = self.sharded, (step, self._updates, version, path)
            self.clock.saved()
            if previous is not None and previous[3] != path and trainer.is_global_zero:
                shutil.rmtree(previous[3], ignore_errors=True)

    def handles_stop(self, trainer: L.Trainer, exception: BaseException) -> bool:
        """Whether ``exception`` is a collective failing because a rank is lost (waited for once per fit)."""
        if self._lost is None:
            # A lost peer fails a collective with a RuntimeError (gloo, DistError), a sharded save with a
            # CheckpointException (a BaseException).
            from torch.distributed.checkpoint.api import CheckpointException

            failed = isinstance(exception, RuntimeError | CheckpointException)
            collective = self._peers is not None and failed
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
        if self.clock.every_s is not None:
            return self._sharded_line(trainer)
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

    def _sharded_line(self, trainer: L.Trainer) -> str:
        """Under ``fsdp2``: nothing is saved (each survivor holds its own shards only); what is on disk."""
        assert self._checkpoint is not None
        at = f"at global step {trainer.global_step}: not saved (under --trainer.strategy fsdp2 a save needs "
        at += "every rank)"
        saved = [c for c in (self.sharded, self._whole) if c is not None]
        if not saved:
            lost, resumed = f"{plural(self._updates)} of this run lost", trainer.ckpt_path
            if resumed:
                return f"{at}; no checkpoint completed in this run ({lost}); resume from {resumed} again"
            return f"{at}; nothing to resume from: no checkpoint completed in this run ({lost})"
        step, updates, version, path = max(saved)
        hint = self._checkpoint.resume_hint.format(path=path)
        return (
            f"{at}; the last complete checkpoint is {path} (global step {step}, update {version}): "
            f"{plural(self._updates - updates)} completed since lost (resume with {hint})"
        )

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and self._peers is not None:
            self._peers.close()
            self._peers = None


def plural(updates: int) -> str:
    return f"{updates} update" + ("" if updates == 1 else "s")
