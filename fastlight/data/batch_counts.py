"""What a training batch holds in env steps: a Rollout's own stats, or a user's ``batch_counts_fn``.

Shared by :class:`~fastlight.callbacks.throughput.RolloutThroughput` and
:class:`~fastlight.callbacks.env_steps.EnvStepBudget`; on a plain Lightning project without a
``batch_counts_fn`` the first batch that is not a Rollout warns once, naming what is missing.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from fastlight.data.protocols import BatchCountsFn
from fastlight.rollout import Rollout, RolloutStats


class BatchCounts:
    """``batch -> RolloutStats | None`` for the callback named ``owner`` (``None``: nothing to count)."""

    def __init__(self, owner: str, fn: BatchCountsFn | None, *, missing: str) -> None:
        self.owner, self.fn, self.missing = owner, fn, missing
        self._warned = False

    def __call__(self, batch: Any) -> RolloutStats | None:
        if isinstance(batch, Rollout):
            return batch.stats
        if self.fn is None:
            if not self._warned:
                self._warned = True
                rank_zero_warn(
                    f"{self.owner}: the training batches are {type(batch).__name__}, not "
                    f"fastlight.rollout.Rollout, so there is nothing to count and {self.missing}; "
                    f"pass {self.owner}(batch_counts_fn=...), a function batch -> "
                    "fastlight.rollout.RolloutStats (at least raw_steps and valid_steps)"
                )
            return None
        stats = self.fn(batch)
        if not isinstance(stats, RolloutStats):
            raise TypeError(
                f"{self.owner} batch_counts_fn must return fastlight.rollout.RolloutStats, "
                f"got {type(stats).__name__}"
            )
        return stats
