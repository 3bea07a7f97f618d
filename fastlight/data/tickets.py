"""``StepTickets``: the DataModule's dataset, one cheap ticket per training step.

Why tickets: Lightning's data fetcher reads one batch ahead of the training step. A strictly
on-policy Rollout can only exist after the previous update, so the ``IterableDataset`` yields cheap
step tickets and ``RolloutDataModule.on_before_batch_transfer`` - which runs right before each
``training_step`` - publishes the current weights and resolves the ticket into the Rollout sampled
with them.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import IterableDataset


class StepTickets(IterableDataset):
    """Yields ``steps_per_epoch`` step tickets; ``RolloutDataModule`` turns each into a Rollout."""

    def __init__(self, steps_per_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.steps_per_epoch))

    def __len__(self) -> int:
        return self.steps_per_epoch
