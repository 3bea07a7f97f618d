"""``PeriodicEvaluation``: full evaluation episodes during training, logged, with ``best.ckpt`` kept.

Every ``every_updates`` updates (or ``every_minutes`` of training), the policy plays ``episodes`` full
episodes on fixed seeds (episode ``i`` on ``seed + i``; per task on a multi-task env) through
:func:`fastlight.evaluation.play_policy`, as ``fastlight evaluate`` does, so evaluating that update's
checkpoint with the same seed gives the same numbers. Logged: ``eval/return`` (mean, with a 95%
percentile-bootstrap ``eval/return_ci_low`` / ``_ci_high``), ``eval/length``, and ``eval/success_rate``
and ``eval/crash_rate`` where the env reports them (on a multi-task env also ``eval/success_rate_<task>``).

``best.ckpt`` (beside this run's ``last.ckpt``) holds the best evaluation so far by ``monitor``. Rank 0
plays between two updates and broadcasts the result, so every rank logs the same numbers and takes part
in the save. The training RNG streams are left as they were, and the best score survives a resume.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from fastlight.data.protocols import EvaluationEnv, RolloutPolicyModule, implements
from fastlight.lightning_compat import log_once

#: What ``monitor`` may name, and whether larger is better by default.
MONITORS = ("eval/return", "eval/success_rate", "eval/crash_rate", "eval/length")


class PeriodicEvaluation(Callback):
    """Evaluation episodes every ``every_updates`` updates or ``every_minutes`` (see the module docstring).

    Args:
        every_updates: updates between two evaluations (``null``: by time only).
        every_minutes: training wall-clock between two evaluations (``null``: by updates only).
        episodes: episodes per evaluation (per task on a multi-task env).
        seed: episode ``i`` is reset with ``seed + i`` (as ``fastlight evaluate --seed``).
        deterministic: the policy's deterministic action (``false``: sampled).
        monitor: the metric ``best.ckpt`` follows, one of :data:`MONITORS`.
        mode: ``max`` or ``min`` (``min`` for ``eval/crash_rate``).
        save_best: keep ``best.ckpt``.
        batch: multi-task env: episodes of one task played in lockstep.
        env_id: the env to play (default: the DataModule's, through :class:`EvaluationEnv`).
        env_kwargs: its settings (merged over the DataModule's when ``env_id`` is not given).
        dirpath: where ``best.ckpt`` goes (default: beside this run's ``last.ckpt``).
    """

    def __init__(
        self,
        every_updates: int | None = 50,
        every_minutes: float | None = None,
        episodes: int = 10,
        seed: int = 10_000,
        deterministic: bool = True,
        monitor: str = "eval/return",
        mode: Literal["max", "min"] = "max",
        save_best: bool = True,
        batch: int = 4,
        env_id: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        dirpath: str | None = None,
    ) -> None:
        super().__init__()
        flag = "PeriodicEvaluation"
        if every_updates is None and every_minutes is None:
            raise ValueError(f"{flag} needs every_updates or every_minutes (both are null)")
        if every_updates is not None and every_updates < 1:
            raise ValueError(f"{flag} every_updates must be >= 1 or null, got {every_updates}")
        if every_minutes is not None and not every_minutes > 0:
            raise ValueError(f"{flag} every_minutes must be > 0 or null, got {every_minutes}")
        if episodes < 1 or batch < 1:
            raise ValueError(f"{flag} episodes and batch must be >= 1, got {episodes} and {batch}")
        if monitor not in MONITORS:
            raise ValueError(f"{flag} monitor must be one of {', '.join(MONITORS)}, got {monitor!r}")
        if mode not in ("max", "min"):
            raise ValueError(f"{flag} mode must be max or min, got {mode!r}")
        self.every_updates, self.every_minutes = every_updates, every_minutes
        self.episodes, self.seed, self.deterministic, self.batch = episodes, seed, deterministic, batch
        self.monitor, self.mode, self.save_best = monitor, mode, save_best
        self.env_id, self.env_kwargs, self.dirpath = env_id, env_kwargs, dirpath
        self.best: float | None = None  # the best monitored value so far (kept across a resume)
        self.last: dict[str, float] = {}  # the latest evaluation's metrics
        self.evaluations, self._updates, self._last_time = 0, 0, time.monotonic()

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        from lightning.pytorch.strategies import ModelParallelStrategy

        if isinstance(trainer.strategy, ModelParallelStrategy):  # rank 0 alone cannot run a sharded policy
            raise ValueError(
                "PeriodicEvaluation does not run under --trainer.strategy fsdp2 yet (rank 0 plays alone, and "
                "a sharded policy's forward needs every rank); use fastlight evaluate on its checkpoints"
            )

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._updates, self._last_time = 0, time.monotonic()

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        self._updates += 1
        due = (self.every_updates is not None and self._updates % self.every_updates == 0) or (
            self.every_minutes is not None and time.monotonic() - self._last_time >= 60 * self.every_minutes
        )
        if trainer.strategy.broadcast(due):  # rank 0's clock decides, for every rank
            self.evaluate(trainer, pl_module)

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        """Play, log, keep ``best.ckpt`` (every rank calls it; rank 0 plays)."""
        metrics = self._play(trainer, pl_module) if trainer.is_global_zero else {}
        metrics = trainer.strategy.broadcast(metrics)
        self._last_time, self.evaluations, self.last = time.monotonic(), self.evaluations + 1, metrics
        log_once(trainer, metrics)
        if self.monitor not in metrics:
            raise ValueError(
                f"PeriodicEvaluation monitor {self.monitor}: the env does not report it on every episode; "
                f"choose one of {', '.join(k for k in MONITORS if k in metrics)}"
            )
        score = metrics[self.monitor]
        if self.best is None or (score > self.best if self.mode == "max" else score < self.best):
            self.best = score
            if self.save_best:
                trainer.save_checkpoint(self.best_path(trainer), weights_only=False)
        if trainer.is_global_zero:
            print(self._line(trainer, metrics), file=sys.stderr, flush=True)
        return metrics

    def best_path(self, trainer: pl.Trainer) -> str:
        """``<dirpath>/best.ckpt``: beside the run's own ``last.ckpt`` unless ``dirpath`` says otherwise."""
        from fastlight.callbacks.preemption import PreemptionCheckpoint

        folder = self.dirpath
        for cb in trainer.callbacks if folder is None else ():
            if isinstance(cb, PreemptionCheckpoint) and cb.dirpath is not None:
                folder = os.path.dirname(cb.run_ckpt_path)
        return os.path.join(folder or os.path.join(trainer.default_root_dir, "checkpoints"), "best.ckpt")

    def _play(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        from fastlight.evaluation import per_task_summary, play_policy, summarise

        if not implements(pl_module, RolloutPolicyModule):
            raise TypeError(
                f"PeriodicEvaluation needs a module with a policy, got {type(pl_module).__name__}"
            )
        env_id, env_kwargs, wrappers = self._env(trainer)
        policy = pl_module.policy
        was_training = policy.training
        policy.eval()
        try:
            # Training's RNG streams stay as they were: a sampled evaluation draws from a fork of them.
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(self.seed)  # as fastlight evaluate does
                episodes, task_names, _ = play_policy(
                    policy, env_id, env_kwargs, episodes=self.episodes, seed=self.seed,
                    deterministic=self.deterministic, wrappers=wrappers, batch=self.batch,
                )  # fmt: skip
        finally:
            policy.train(was_training)
        s = summarise(episodes, seed=self.seed)
        out = {"eval/return": s["return"]["mean"], "eval/return_ci_low": s["return"]["ci_low"],
               "eval/return_ci_high": s["return"]["ci_high"], "eval/length": s["length"]["mean"]}  # fmt: skip
        for key in ("success_rate", "crash_rate"):
            if s[key] is not None:
                out[f"eval/{key}"] = s[key]["rate"]
        if task_names:
            tasks = per_task_summary(episodes, task_names, n_boot=10_000, seed=self.seed)
            out["eval/success_rate"] = tasks["mean"]["rate"]
            out |= {f"eval/success_rate_{t}": v["rate"] for t, v in tasks["per_task"].items()}
        return {k: float(v) for k, v in out.items()}

    def _env(self, trainer: pl.Trainer) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        data = trainer.datamodule
        if self.env_id is not None:
            wrappers = data.evaluation_env()[2] if implements(data, EvaluationEnv) else []
            return self.env_id, dict(self.env_kwargs or {}), wrappers
        if not implements(data, EvaluationEnv):
            raise ValueError(
                "PeriodicEvaluation env_id: the run's DataModule does not say which env it samples "
                "(no evaluation_env()); give the callback env_id (and env_kwargs)"
            )
        env_id, env_kwargs, wrappers = data.evaluation_env()
        return env_id, {**env_kwargs, **(self.env_kwargs or {})}, wrappers

    def _line(self, trainer: pl.Trainer, m: dict[str, float]) -> str:
        shown = [k for k in ("eval/success_rate", "eval/crash_rate") if k in m]
        rates = "".join(f", {k.removeprefix('eval/')} {m[k]:.2f}" for k in shown)
        return (
            f"fastlight: eval at step {trainer.global_step}: return {m['eval/return']:.3f} "
            f"[{m['eval/return_ci_low']:.3f}, {m['eval/return_ci_high']:.3f}], length {m['eval/length']:.1f}"
            f"{rates} ({self.episodes} episodes; best {self.monitor} {self.best:.3f})"
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "evaluations": self.evaluations}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best, self.evaluations = state_dict.get("best"), int(state_dict.get("evaluations", 0))
