"""``RolloutProgressBar``: the training progress bar in RL units (Rollouts, env steps, return, SPS).

One bar spans the whole fit (an epoch here is only a checkpoint period) and reads::

    rollout 12/500 | env_steps 10,202 | return 23.4 | ep_len 41.2 | SPS 1,950 |##    | 2% [00:10<07:50]

**Items**, each once logged: ``env_steps`` (:class:`~fastlight.callbacks.env_steps.EnvStepBudget`'s count),
``return`` and ``ep_len`` (``rollout/return``, ``rollout/episode_length``), ``SPS`` (``perf/effective_tps``,
else the env steps since the first Rollout over the seconds since then), then every other ``prog_bar`` metric.

**Total**, where one is known: an ``EnvStepBudget``'s ``total_env_steps`` (in env steps), else
``--trainer.max_steps`` over the module's ``optimizer_steps_per_update`` (in Rollouts, re-estimated every
Rollout), bounded by ``--trainer.max_epochs`` too; otherwise only the counts.

**Not a terminal** (a CI log, ``| tee``): the same items as one plain line every ``log_every_s`` seconds
(and at the end), with the percentage done and the time left (by ``--trainer.max_time`` where sooner)::

    fastlight: rollout 12/500 | env_steps 10,202 | return 23.4 | 2% | 0:00:10 elapsed, 0:07:50 left

A batch that is not a :class:`~fastlight.rollout.Rollout` counts as a ``batch``. Given to a ``Trainer`` by
hand, list it after the callbacks whose metrics it shows (it draws in ``on_train_batch_end``).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, TextIO

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Timer, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from typing_extensions import override

from fastlight.callbacks.env_steps import EnvStepBudget
from fastlight.data.protocols import TrainsPolicy, implements
from fastlight.rollout import Rollout

#: The clock; a module attribute so tests can substitute a deterministic one.
_now = time.monotonic

#: Logged name -> the bar's name, in the bar's order (after ``env_steps``).
RL_ITEMS = {"rollout/return": "return", "rollout/episode_length": "ep_len"}
SPS_KEY = "perf/effective_tps"
#: Logged names the bar shows under its own item, or not at all (Lightning's logger version).
_MAPPED = frozenset({"env_steps", SPS_KEY, *RL_ITEMS, "v_num"})

_WITH_TOTAL = "{desc} |{bar}| {percentage:3.0f}% [{elapsed}<{remaining}]"
_NO_TOTAL = "{desc} [{elapsed}]"


class RolloutProgressBar(TQDMProgressBar):
    """One bar for the whole fit, counting Rollouts and env steps (see the module docstring)."""

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, log_every_s: float = 60.0) -> None:
        """
        Args:
            refresh_rate: redraw the bar every this many Rollouts (0 turns it off).
            process_position: the bar's line, for several bars at once (Lightning's).
            log_every_s: with stdout not a terminal, seconds between two plain progress lines (> 0).
        """
        if not log_every_s > 0:
            raise ValueError(f"RolloutProgressBar log_every_s must be > 0, got {log_every_s}")
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=False)
        self.log_every_s = float(log_every_s)
        self._logged_at: float | None = None  # when the last plain line was printed
        self._started = _now()
        self.unit = "rollout"  # "batch" once a training batch is not a Rollout
        self._first_count: tuple[float, int] | None = None  # (time, env steps) at the first batch

    @property
    @override
    def is_enabled(self) -> bool:
        return super().is_enabled and _is_terminal(sys.stdout)

    @override
    def init_train_tqdm(self) -> Tqdm:
        return Tqdm(
            desc=f"{self.unit} 0",
            position=(2 * self.process_position),
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            bar_format=_NO_TOTAL,
        )

    # ------------------------------------------------------------------ counts and totals
    def batches_done(self, trainer: pl.Trainer) -> int:
        """Training batches (Rollouts) of the run so far, a resumed run's and the current one included."""
        return trainer.fit_loop.epoch_loop.batch_progress.total.processed

    def env_steps(self, trainer: pl.Trainer) -> int | None:
        """The run's env-step count: ``EnvStepBudget``'s, else a logged ``env_steps``; ``None``: neither."""
        budget = _env_step_budget(trainer)
        if budget is not None:
            return budget.env_steps
        value = trainer.callback_metrics.get("env_steps")
        return None if value is None else int(round(float(value)))

    def rollout_total(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> int | None:
        """The Rollouts the run will have trained on when ``max_steps`` or ``max_epochs`` stop it, or None."""
        done = self.batches_done(trainer)
        bounds = []
        if trainer.max_steps is not None and trainer.max_steps > 0:
            left = max(trainer.max_steps - trainer.global_step, 0)
            per_batch = pl_module.optimizer_steps_per_update if implements(pl_module, TrainsPolicy) else None
            if isinstance(per_batch, int) and per_batch > 0:
                left = math.ceil(left / per_batch)
            elif pl_module.automatic_optimization:
                left *= trainer.accumulate_grad_batches
            bounds.append(done + left)  # manual optimisation without a count: one step per batch
        per_epoch = trainer.num_training_batches
        if trainer.max_epochs is not None and trainer.max_epochs > 0 and math.isfinite(per_epoch):
            bounds.append(trainer.max_epochs * int(per_epoch))
        return min(bounds) if bounds else None

    # ------------------------------------------------------------------ what the bar shows
    @override
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """``env_steps``, ``return``, ``ep_len``, ``SPS``, then the other ``prog_bar`` metrics."""
        logged, steps = trainer.callback_metrics, self.env_steps(trainer)
        items: dict[str, Any] = {} if steps is None else {"env_steps": steps}
        items |= {name: float(logged[key]) for key, name in RL_ITEMS.items() if key in logged}
        sps = self._sps(trainer, steps)
        if sps is not None:
            items["SPS"] = sps
        return items | {k: v for k, v in trainer.progress_bar_metrics.items() if k not in _MAPPED}

    def _sps(self, trainer: pl.Trainer, steps: int | None) -> float | None:
        if SPS_KEY in trainer.callback_metrics:
            return float(trainer.callback_metrics[SPS_KEY])
        if steps is None or self._first_count is None:
            return None
        # From the first Rollout on: the samplers' start-up before it would understate the rate.
        start, first = self._first_count
        elapsed = _now() - start
        return (steps - first) / elapsed if elapsed > 0 and steps > first else None

    def _describe(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule
    ) -> tuple[list[str], int, int | None]:
        """The items as ``name value`` texts, and the progress ``(n, total)`` the bar fills."""
        rollouts, rollout_total = self.batches_done(trainer), self.rollout_total(trainer, pl_module)
        budget = _env_step_budget(trainer)
        env_total = None if budget is None else budget.total_env_steps
        parts = [f"{self.unit} {rollouts:,}" + ("" if rollout_total is None else f"/{rollout_total:,}")]
        for name, value in self.get_metrics(trainer, pl_module).items():
            total = f"/{env_total:,}" if name == "env_steps" and env_total is not None else ""
            parts.append(f"{name} {_format(value)}{total}")
        if env_total is not None:
            return parts, budget.env_steps, env_total
        return parts, rollouts, rollout_total

    def _redraw(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        bar = self._train_progress_bar
        if bar is None or bar.disable:
            return
        parts, n, total = self._describe(trainer, pl_module)
        bar.bar_format = _NO_TOTAL if total is None else _WITH_TOTAL
        bar.total = total
        bar.n = min(n, total) if total is not None else n
        bar.set_description_str(" | ".join(parts), refresh=False)
        bar.refresh()

    # ------------------------------------------------------------------ Lightning hooks
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.train_progress_bar = self.init_train_tqdm()
        self._first_count, self._logged_at, self._started = None, None, _now()
        budget = _env_step_budget(trainer)
        start = budget.env_steps if budget is not None and budget.total_env_steps else None
        # tqdm's rate and time left count from here: a resumed run starts at its count, not at 0.
        self.train_progress_bar.initial = self.batches_done(trainer) if start is None else start
        self._redraw(trainer, pl_module)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        pass  # one bar for the whole run: an epoch is only a checkpoint period here

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, *_: Any
    ) -> None:
        if not isinstance(batch, Rollout):
            self.unit = "batch"

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        if self._first_count is None:
            steps = self.env_steps(trainer)
            if steps is not None:
                self._first_count = (_now(), steps)
        if self._should_update(self.batches_done(trainer), -1):
            self._redraw(trainer, pl_module)
        if self._logging and (self._logged_at is None or _now() - self._logged_at >= self.log_every_s):
            self._log_line(trainer, pl_module)

    @property
    def _logging(self) -> bool:
        """Plain lines instead of the bar: enabled, with stdout not a terminal (rank 0 only)."""
        return super().is_enabled and not _is_terminal(sys.stdout)

    def _log_line(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        parts, n, total = self._describe(trainer, pl_module)
        now = _now()
        elapsed = now - self._started
        clock = f"{_hms(elapsed)} elapsed"
        done = min(n / total, 1.0) if total else None
        left = elapsed * (1 - done) / done if done else None
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
        remaining = None if timer is None else timer.time_remaining()
        if remaining is not None and (left is None or remaining < left):
            # --trainer.max_time stops the run first: its clock (resumes included) is the one to show.
            spent = timer.time_elapsed()
            done, left = min(spent / max(spent + remaining, 1e-9), 1.0), max(remaining, 0.0)
        if done is not None:
            parts.append(f"{done:.0%}")
        if left is not None:
            clock += f", {_hms(left)} left"
        print(f"fastlight: {' | '.join(parts)} | {clock}", file=sys.stdout, flush=True)
        self._logged_at = now

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._redraw(trainer, pl_module)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._redraw(trainer, pl_module)  # the last Rollout, whatever the refresh rate
        if self._logging:
            self._log_line(trainer, pl_module)
        self.train_progress_bar.close()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.val_progress_bar.close()
        self.reset_dataloader_idx_tracker()
        if trainer.state.fn == "fit":
            self._redraw(trainer, pl_module)


def _env_step_budget(trainer: pl.Trainer) -> EnvStepBudget | None:
    return next((cb for cb in trainer.callbacks if isinstance(cb, EnvStepBudget)), None)


def _format(value: Any) -> str:
    """``10,202`` for a count; a measure to three significant digits (``0.0123``), grouped past 1000."""
    if hasattr(value, "item"):  # a tensor a user's get_metrics returned
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if math.isfinite(value) and abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False
