"""LostRankCheckpoint in one process: its settings are checked, it needs PreemptionCheckpoint's file,
and alone on one rank it watches nothing and copies nothing (even with ``rollback``). With ranks, in
real processes: tests/faults/test_lost_rank.py."""

from __future__ import annotations

import pytest
from torch.distributed.checkpoint.api import CheckpointException
from torch.utils.data import DataLoader

from fastlight.callbacks.lost_rank import LostRankCheckpoint
from fastlight.callbacks.preemption import PreemptionCheckpoint
from tests.faults.test_preemption import STEPS_PER_UPDATE, Rollouts, SignalInUpdate, trainer


def test_bad_peer_timeout_is_refused():
    with pytest.raises(ValueError, match="peer_timeout_minutes must be > 0 or null, got 0$"):
        LostRankCheckpoint(peer_timeout_minutes=0)


def test_without_a_preemption_checkpoint_it_says_what_is_missing(tmp_path):
    lost = LostRankCheckpoint()
    t = trainer(tmp_path, lost, max_steps=2)
    with pytest.raises(ValueError, match="add a fastlight.PreemptionCheckpoint to the trainer's callbacks"):
        t.fit(SignalInUpdate(), DataLoader(Rollouts(5), batch_size=None))


def test_one_process_watches_nothing_and_copies_nothing(tmp_path):
    lost = LostRankCheckpoint(rollback=True)
    t = trainer(tmp_path, PreemptionCheckpoint(every_minutes=None), max_steps=3 * STEPS_PER_UPDATE)
    t.callbacks.append(lost)
    t.fit(SignalInUpdate(), DataLoader(Rollouts(10), batch_size=None))
    assert t.global_step == 3 * STEPS_PER_UPDATE
    assert lost._peers is None and lost.rollback_point is None and lost.peer_lost_line is None
    assert lost._boundary == 3 * STEPS_PER_UPDATE  # the last completed update


class _Peers:
    """What the peer watch says after a collective failed: rank 1 is gone."""

    def wait_for_loss(self) -> dict[int, str]:
        return {1: "was killed"}

    def behind(self) -> dict[int, str]:
        return {}


@pytest.mark.parametrize(
    "exception, handled",
    [
        (RuntimeError("gloo: connection closed by peer"), True),
        (CheckpointException("save", {1: (RuntimeError("peer"), None)}), True),  # lost mid sharded save
        (KeyError("not a collective"), False),
    ],
)
def test_a_collective_or_a_sharded_save_failing_with_a_peer_lost_is_a_rank_loss(exception, handled):
    lost = LostRankCheckpoint()
    lost._peers = _Peers()
    assert lost.handles_stop(None, exception) is handled
