"""``RolloutThroughput``: logs FAST's throughput family (§Problem Definition) under ``perf/*``.

It reads the sampler counters every :class:`~fastlight.rollout.Rollout` carries (``batch.stats``); other
batches are counted by ``batch_counts_fn`` (batch -> :class:`~fastlight.rollout.RolloutStats`), else
the first one warns once. Every count is in env steps. ``perf/raw_tps`` and ``perf/effective_tps``
divide by the trainer-side wall clock between consecutive Rollouts (the first one only starts the
clock); ``perf/per_sampler_tps`` is one sampler's rate over its busy time. Under DDP counts are summed
over the ranks and clocks take their max; the checkpoint keeps the job's ``totals`` and each rank's own
(``per_rank``, :mod:`fastlight.rank_state`).

Logged keys: ``perf/raw_tps``, ``perf/effective_tps`` (progress bar), ``perf/sample_efficiency``,
``perf/time_efficiency``, ``perf/per_sampler_tps``, ``perf/mean_episode_length``,
``perf/resets_per_1k_valid``, ``perf/truncated_episode_share`` (cut by a unified truncation),
``perf/time_limit_share`` (ended by the env's own time limit) and the cumulative
``perf/valid_steps_total`` / ``perf/raw_steps_total``. A ratio undefined over a window is not logged.
"""

from __future__ import annotations

import math
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from fastlight.data.batch_counts import BatchCounts
from fastlight.data.protocols import BatchCountsFn
from fastlight.metrics.throughput import ThroughputMetrics
from fastlight.rank_state import PER_RANK_KEY, counters_for_rank, gather_per_rank, per_rank_entries, world

#: The clock; a module attribute so tests can substitute a deterministic one.
_now = time.perf_counter

_TOTALS = ("raw_steps", "valid_steps", "episodes", "global_resets")

#: Checkpoint key of this callback's state: fixed, so that a subclass or a rename keeps restoring it.
STATE_KEY = "fastlight.RolloutThroughput"


class RolloutThroughput(Callback):
    """Logs raw/effective throughput, sample and time efficiency, episode length, resets.

    Args:
        window: number of Rollout batches aggregated into each logged value.
        prog_bar: show ``perf/effective_tps`` in the progress bar.
        batch_counts_fn: ``batch -> RolloutStats`` for training batches that are not Rollouts.
    """

    def __init__(
        self, window: int = 1, prog_bar: bool = True, batch_counts_fn: BatchCountsFn | None = None
    ) -> None:
        super().__init__()
        if window < 1:
            raise ValueError(f"RolloutThroughput window must be >= 1, got {window}")
        self.window, self.prog_bar, self.batch_counts_fn = window, prog_bar, batch_counts_fn
        self._batch_counts = BatchCounts("RolloutThroughput", batch_counts_fn, missing="no perf/* is logged")
        self.metric = ThroughputMetrics()
        self.totals: dict[str, int] = dict.fromkeys(_TOTALS, 0)
        self._last: float | None = None
        self._pending = 0

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.metric = self.metric.to(pl_module.device)  # NCCL gathers need states on the device
        self.metric.reset()
        self._last, self._pending = None, 0

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stats = self._batch_counts(batch)
        if stats is None:
            return
        self.totals["raw_steps"] += stats.raw_steps
        self.totals["valid_steps"] += stats.valid_steps
        self.totals["episodes"] += len(stats.episodes)
        self.totals["global_resets"] += stats.global_resets
        now = _now()
        last, self._last = self._last, now
        if last is None:  # the first Rollout only starts the clock
            return
        self.metric.update(stats, elapsed=now - last)
        self._pending += 1
        if self._pending >= self.window:
            self._log(trainer, pl_module)

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        values = {f"perf/{k}": float(v) for k, v in self.metric.compute().items() if not math.isnan(float(v))}
        self.metric.reset()
        self._pending = 0
        totals = self._job_totals(trainer, pl_module.device, ("valid_steps", "raw_steps"))
        values |= {f"perf/{k}_total": float(v) for k, v in totals.items()}
        bar = {k: values.pop(k) for k in ("perf/effective_tps",) if k in values}
        kw: dict[str, Any] = {"on_step": True, "on_epoch": False, "batch_size": 1}
        if bar:
            pl_module.log_dict(bar, prog_bar=self.prog_bar, **kw)
        pl_module.log_dict(values, prog_bar=False, **kw)

    def _job_totals(self, trainer: pl.Trainer, device: torch.device, keys: tuple[str, ...]) -> dict[str, int]:
        """``keys`` of the totals, summed over the ranks (each counts its own samplers)."""
        local = torch.tensor([float(self.totals[k]) for k in keys], dtype=torch.float64, device=device)
        if trainer.world_size > 1:  # float64: exact up to 2**53 steps
            local = trainer.strategy.reduce(local, reduce_op="sum")
        return {k: int(v) for k, v in zip(keys, local.tolist(), strict=True)}

    @property
    @override
    def state_key(self) -> str:
        return STATE_KEY

    @override
    def state_dict(self) -> dict[str, Any]:
        # Each rank's own totals go into the file rank 0 writes; ``totals`` is the job's, their sum.
        ranks = gather_per_rank(dict(self.totals))
        totals = {k: sum(int(r.get(k, 0)) for r in ranks) for k in _TOTALS}
        return {"totals": totals, PER_RANK_KEY: ranks}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        rank, size = world()
        totals = counters_for_rank(per_rank_entries(state_dict, state_dict["totals"]), rank, size)
        self.totals = dict.fromkeys(_TOTALS, 0) | totals
