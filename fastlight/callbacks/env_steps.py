"""``EnvStepBudget``: counts the env steps a run has trained on, logs them, and stops at a budget.

**What counts.** The real env steps of every Rollout (``stats.valid_steps``, summed over the DDP ranks):
not DPSA's padding, nor the steps of items dropped as stale. With action chunks a transition counts the
env steps its chunk executed.

With ``total_env_steps`` set, training stops at the first Rollout boundary at or past it, saying so in
one line. ``env_steps`` (cumulative) is logged, also in the progress bar; for TensorBoard the
``tensorboard_keys`` metrics are also written as ``env_steps/<key>`` at the env-step count.

**Learning-rate annealing.** With ``anneal_lr``, every parameter group's learning rate falls linearly
from its value at the run's start to 0 at ``total_env_steps``, as CleanRL's PPO anneals (Huang et al.,
"The 37 Implementation Details of PPO", detail 4). A learning rate changed at a resume becomes the
schedule's new starting value.

    fastlight fit --config configs/highway_dpsa.yaml --trainer.callbacks+=EnvStepBudget \\
        --trainer.callbacks.total_env_steps 200000
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from fastlight.data.batch_counts import BatchCounts
from fastlight.data.protocols import BatchCountsFn

#: Checkpoint key of this callback's state (fixed, whatever its arguments).
STATE_KEY = "fastlight.EnvStepBudget"

DEFAULT_TB_KEYS = ("rollout/return", "rollout/episode_length", "perf/effective_tps")


class EnvStepBudget(Callback):
    """Counts env steps (``env_steps``), and stops training once ``total_env_steps`` are reached.

    Args:
        total_env_steps: the run's env-step budget; ``None`` only counts and logs.
        prog_bar: show ``env_steps`` in the progress bar.
        anneal_lr: anneal every parameter group's learning rate linearly to 0 at ``total_env_steps``.
        tensorboard_keys: metrics also written to TensorBoard against env steps (``env_steps/<key>``).
        batch_counts_fn: ``batch -> RolloutStats`` for training batches that are not Rollouts (its
            ``valid_steps`` are the batch's env steps); ``None``: such batches warn once, count nothing.
    """

    def __init__(
        self,
        total_env_steps: int | None = None,
        prog_bar: bool = True,
        anneal_lr: bool = False,
        tensorboard_keys: list[str] | None = None,
        batch_counts_fn: BatchCountsFn | None = None,
    ) -> None:
        super().__init__()
        if total_env_steps is not None and total_env_steps < 1:
            raise ValueError(
                f"EnvStepBudget total_env_steps must be >= 1 or null (no budget), got {total_env_steps}"
            )
        if anneal_lr and total_env_steps is None:
            raise ValueError("EnvStepBudget anneal_lr needs total_env_steps (where the rate reaches 0)")
        self.total_env_steps, self.prog_bar, self.anneal_lr = total_env_steps, prog_bar, anneal_lr
        # Per optimizer, per group: the schedule's starting rate, and the rate it last set (to tell a rate
        # restored from a checkpoint from one set anew at a resume).
        self._base_lrs: list[list[float]] | None = None
        self._set_lrs: list[list[float]] | None = None
        self.tensorboard_keys = list(DEFAULT_TB_KEYS if tensorboard_keys is None else tensorboard_keys)
        self.env_steps, self.batch_counts_fn = 0, batch_counts_fn
        missing = "no env_steps are counted, so total_env_steps never stops the run"
        self._batch_counts = BatchCounts("EnvStepBudget", batch_counts_fn, missing=missing)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.anneal_lr:
            return
        current = [[float(g["lr"]) for g in opt.param_groups] for opt in trainer.optimizers]
        saved_base, saved_set = self._base_lrs, self._set_lrs
        if saved_base is None or saved_set is None or len(saved_set) != len(current):
            self._base_lrs = current
            return
        # A group still at the rate this schedule last set keeps the schedule's start.
        self._base_lrs = [
            [b if lr == s else lr for lr, b, s in zip(cur, base, sets, strict=True)]
            for cur, base, sets in zip(current, saved_base, saved_set, strict=True)
        ]

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        if not self.anneal_lr or self._base_lrs is None or self.total_env_steps is None:
            return
        frac = max(0.0, 1.0 - self.env_steps / self.total_env_steps)
        self._set_lrs = []
        for opt, bases in zip(trainer.optimizers, self._base_lrs, strict=True):
            for group, base in zip(opt.param_groups, bases, strict=True):
                group["lr"] = base * frac
            self._set_lrs.append([float(g["lr"]) for g in opt.param_groups])
        pl_module.log("learning_rate", self._set_lrs[0][0], on_step=True, on_epoch=False, batch_size=1)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stats = self._batch_counts(batch)
        if stats is None:
            return
        steps = torch.tensor(float(stats.valid_steps), dtype=torch.float64, device=pl_module.device)
        if trainer.world_size > 1:  # the job's count: every rank's samplers
            steps = trainer.strategy.reduce(steps, reduce_op="sum")
        self.env_steps += int(steps.item())
        # float64: a float32 metric would round counts past 2**24 (16.7M steps).
        value = torch.tensor(float(self.env_steps), dtype=torch.float64)
        pl_module.log("env_steps", value, on_step=True, on_epoch=False, prog_bar=self.prog_bar, batch_size=1)
        self._tensorboard(trainer)
        if self.total_env_steps is not None and self.env_steps >= self.total_env_steps:
            if not trainer.should_stop:
                rank_zero_info(
                    f"fastlight: env-step budget reached: {self.env_steps} env steps >= total_env_steps "
                    f"{self.total_env_steps}; stopping at this rollout boundary"
                )
            trainer.should_stop = True

    def _tensorboard(self, trainer: pl.Trainer) -> None:
        metrics = trainer.callback_metrics  # this step's values, as logged so far
        values = {f"env_steps/{key}": float(metrics[key]) for key in self.tensorboard_keys if key in metrics}
        for logger in trainer.loggers:  # through the logger, not its writer (fastlight.log_writes)
            if isinstance(logger, TensorBoardLogger) and trainer.global_rank == 0 and values:
                logger.log_metrics(values, step=self.env_steps)

    @property
    @override
    def state_key(self) -> str:
        return STATE_KEY

    @override
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"env_steps": self.env_steps}
        if self._base_lrs is not None:
            state["base_lrs"], state["set_lrs"] = self._base_lrs, self._set_lrs
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.env_steps = int(state_dict["env_steps"])
        self._base_lrs, self._set_lrs = state_dict.get("base_lrs"), state_dict.get("set_lrs")
