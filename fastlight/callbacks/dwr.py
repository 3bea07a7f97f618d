"""``DynamicWeightedResampling``: sample tasks in proportion to their recent failure rate (AcceRL §DWR).

Per task ``k`` a sliding window holds the outcomes of its last ``window`` episodes, and ``f_k`` is the
task's failure *rate* in it (in ``[0, 1]``; 1 for a task with no outcome yet). The sampling weight is

    p_k = (f_k + eps) / sum_j (f_j + eps)

with ``eps`` the Laplace smoothing. Outcomes from every sampler and DDP rank are pooled into the same
windows (AcceRL keeps them per worker); an episode cut by a unified truncation has no outcome. The weights
are pushed to the DataModule after every update, logged as ``dwr/weight_<task>`` and saved in checkpoints.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.core.mixins import HyperparametersMixin
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from fastlight.data.protocols import MultiTaskData, TaskWeightSink, require
from fastlight.rollout import Rollout


def dwr_weights(failure_rates: Tensor, *, eps: float) -> Tensor:
    """``p_k = (f_k + eps) / sum_j (f_j + eps)`` (AcceRL §DWR), ``failure_rates [K]`` -> ``[K]`` float64.
    Raises ``ValueError`` on another shape, on ``eps <= 0``, and on a rate outside ``[0, 1]`` (or NaN)."""
    if failure_rates.dim() != 1:
        raise ValueError(f"dwr_weights: failure_rates must be [K], got shape {tuple(failure_rates.shape)}")
    if eps <= 0:
        raise ValueError(f"dwr_weights: eps must be > 0, got {eps}")
    f = failure_rates.to(torch.float64)
    if not bool(((f >= 0) & (f <= 1)).all()):
        raise ValueError(
            f"dwr_weights: failure rates must lie in [0, 1] (failures / outcomes per task, not counts), "
            f"got {f.tolist()}"
        )
    w = f + eps
    return w / w.sum()


class DynamicWeightedResampling(Callback):
    """Task weights from pooled, windowed failure rates (an untried task counts as rate 1).

    Args:
        num_tasks: number of tasks; default: ``len(task_names)`` if given, else the env's task count.
        window: outcomes kept per task (the sliding window).
        eps: Laplace smoothing (> 0): the largest weight is at most ``(1 + eps) / eps`` times the smallest.
        task_names: names used in the logged keys (default: the env's task names, else the task ids).
    """

    def __init__(
        self,
        num_tasks: int | None = None,
        window: int = 100,
        eps: float = 1.0,
        task_names: list[str] | None = None,
    ) -> None:
        super().__init__()
        if num_tasks is None and task_names is not None:
            num_tasks = len(task_names)
        if num_tasks is not None and num_tasks < 1:
            raise ValueError(f"DynamicWeightedResampling num_tasks must be >= 1, got {num_tasks}")
        if window < 1:
            raise ValueError(f"DynamicWeightedResampling window must be >= 1, got {window}")
        if eps <= 0:
            raise ValueError(f"DynamicWeightedResampling eps must be > 0, got {eps}")
        if task_names is not None and len(task_names) != num_tasks:
            raise ValueError(
                f"DynamicWeightedResampling task_names has {len(task_names)} names, num_tasks is {num_tasks}"
            )
        self.window, self.eps = window, eps
        self.num_tasks: int | None = None
        self.task_names: list[str] = []
        self.outcomes: list[deque[bool]] = []
        self._given_names = task_names is not None
        self._warned = False
        if num_tasks is not None:
            self._size(num_tasks, task_names)

    def _size(self, num_tasks: int, task_names: list[str] | tuple[str, ...] | None) -> None:
        self.num_tasks = num_tasks
        self.task_names = list(task_names) if task_names else [str(k) for k in range(num_tasks)]
        if len(self.outcomes) != num_tasks:
            self.outcomes = [deque(maxlen=self.window) for _ in range(num_tasks)]

    def _size_from(self, datamodule: object) -> None:
        """Take the task count (and names, unless given) from the DataModule's env; check a given count."""
        env_names = datamodule.task_names if isinstance(datamodule, MultiTaskData) else None
        hp = datamodule.hparams if isinstance(datamodule, HyperparametersMixin) else {}
        env = f"--data.env_id {hp['env_id']}" if "env_id" in hp else type(datamodule).__name__
        if env_names is None:
            if self.num_tasks is None:
                raise TypeError(
                    f"DynamicWeightedResampling needs a multi-task env (a DataModule implementing "
                    f"fastlight.data.protocols.MultiTaskData, with task_names and set_task_weights) or "
                    f"an explicit num_tasks; {env} has no tasks"
                )
            return
        if self.num_tasks is None:
            self._size(len(env_names), env_names)
        elif self.num_tasks != len(env_names):
            raise ValueError(
                f"DynamicWeightedResampling num_tasks is {self.num_tasks} but {env} has "
                f"{len(env_names)} tasks {list(env_names)}: drop num_tasks to take the env's count"
            )
        elif not self._given_names:
            self.task_names = list(env_names)

    # ------------------------------------------------------------------ statistics
    def record(self, task_ids: list[int], successes: list[bool]) -> None:
        """Append outcomes (already pooled over ranks) to the task windows."""
        if self.num_tasks is None:
            raise RuntimeError("DynamicWeightedResampling has no num_tasks yet: it is read at setup")
        for k, ok in zip(task_ids, successes, strict=True):
            if not 0 <= k < self.num_tasks:
                raise ValueError(f"DynamicWeightedResampling: task id {k} outside [0, {self.num_tasks})")
            self.outcomes[k].append(bool(ok))

    def failure_rates(self) -> Tensor:
        """``[K]`` float64: failures / outcomes in each task's window; 1.0 for a task with none yet."""
        rates = [sum(not ok for ok in w) / len(w) if w else 1.0 for w in self.outcomes]
        return torch.tensor(rates, dtype=torch.float64)

    def weights(self) -> Tensor:
        """``[K]`` float64 sampling probabilities, ``dwr_weights(self.failure_rates(), eps=self.eps)``."""
        return dwr_weights(self.failure_rates(), eps=self.eps)

    def success_rates(self) -> Tensor:
        return torch.tensor([sum(w) / len(w) if w else float("nan") for w in self.outcomes])

    # ------------------------------------------------------------------ Lightning
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # weights nobody applies would be a silent no-op: refuse such a run
            require(trainer.datamodule, TaskWeightSink, who="DynamicWeightedResampling", what="a DataModule")
            self._size_from(trainer.datamodule)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._push(trainer)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(batch, Rollout):
            if not self._warned:
                self._warned = True
                rank_zero_warn(
                    f"DynamicWeightedResampling: the training batches are {type(batch).__name__}, not "
                    "fastlight.rollout.Rollout, so no task outcome (Rollout.stats.episodes) is recorded "
                    "and the task weights never change"
                )
            return
        ended = [e for e in batch.stats.episodes if not e.cut]
        rows = [[e.task_id, int(e.success is True)] for e in ended]  # None: the env reports no success
        local = torch.tensor(rows, dtype=torch.long).reshape(-1, 2)
        pooled = _gather_rows(trainer, local)
        self.record(pooled[:, 0].tolist(), pooled[:, 1].bool().tolist())
        self._push(trainer)
        metrics: dict[str, float] = {}
        rows = zip(self.task_names, self.weights().tolist(), self.success_rates().tolist(), strict=True)
        for name, w, sr in rows:
            metrics[f"dwr/weight_{name}"] = w
            if sr == sr:  # not NaN: the task has outcomes
                metrics[f"dwr/success_rate_{name}"] = sr
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    def _push(self, trainer: pl.Trainer) -> None:
        trainer.datamodule.set_task_weights(self.weights().tolist())

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"outcomes": [list(w) for w in self.outcomes], "window": self.window, "eps": self.eps}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        outcomes = state_dict["outcomes"]
        if self.num_tasks is None:
            self._size(len(outcomes), None)
        elif len(outcomes) != self.num_tasks:
            raise ValueError(
                f"DynamicWeightedResampling: the checkpoint holds {len(outcomes)} tasks, this run has "
                f"{self.num_tasks}"
            )
        self.outcomes = [deque(w, maxlen=self.window) for w in outcomes]


def _gather_rows(trainer: pl.Trainer, rows: Tensor) -> Tensor:
    """Concatenate every rank's ``[n_r, 2]`` rows (uneven ``n_r``) in rank order."""
    if trainer.world_size == 1:
        return rows
    n = torch.tensor([rows.shape[0]], device=trainer.strategy.root_device)
    counts = trainer.strategy.all_gather(n).reshape(-1)
    longest = int(counts.max())
    if longest == 0:  # no rank finished an episode in this rollout (every rank saw the same counts)
        return rows.reshape(0, 2)
    padded = torch.zeros(longest, 2, dtype=torch.long, device=n.device)
    padded[: rows.shape[0]] = rows.to(n.device)
    everything = trainer.strategy.all_gather(padded).reshape(-1, longest, 2)
    return torch.cat([everything[r, : int(c)] for r, c in enumerate(counts)]).cpu()
