"""``LearningCurve``: the objectives study's record of one run, read off the training batches.

Each Rollout the learner trains on adds one point: env steps consumed so far (valid transitions),
the mean return of the episodes that *completed* in it (none: no point), and the policy lag of its
valid steps (trainer version - behaviour version, AcceRL §staleness). The sampler counters give the
sampling path's own throughput (valid steps per second of sampler busy time).
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from fastlight.rollout import Rollout


class LearningCurve(Callback):
    """Return of completed episodes against env steps, policy lag and throughput of one run."""

    def __init__(self) -> None:
        super().__init__()
        self.env_steps = 0
        self.points: list[tuple[int, float]] = []  # (env steps so far, mean completed-episode return)
        self.lag_sum = 0.0
        self.lag_max = 0
        self.lag_count = 0
        self.sampler_steps = 0
        self.sampler_busy_s = 0.0
        self.wall_s = 0.0
        self._t0: float | None = None

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._t0 = time.perf_counter()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(batch, Rollout):
            return
        # Read before training_step bumps the version: the lag the update actually sees.
        versions = batch.policy_version[batch.valid]
        if versions.numel():
            lag = int(pl_module.policy_version) - versions
            self.lag_sum += float(lag.sum())
            self.lag_count += int(versions.numel())
            self.lag_max = max(self.lag_max, int(lag.max()))

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(batch, Rollout):
            return
        self.env_steps += batch.num_valid
        done = [e.ret for e in batch.stats.episodes if not e.cut]
        if done:
            self.points.append((self.env_steps, sum(done) / len(done)))
        self.sampler_steps += batch.stats.valid_steps
        self.sampler_busy_s += batch.stats.wall_time
        if self._t0 is not None:
            self.wall_s = time.perf_counter() - self._t0

    @property
    def mean_lag(self) -> float:
        return self.lag_sum / max(self.lag_count, 1)

    @property
    def sampler_tps(self) -> float:
        """Valid env steps per second of one sampler's busy time (policy inference included)."""
        return self.sampler_steps / max(self.sampler_busy_s, 1e-9)

    @property
    def end_to_end_tps(self) -> float:
        """Env steps the learner consumed per second of training wall time (updates included)."""
        return self.env_steps / max(self.wall_s, 1e-9)

    def score(self, last_k: int) -> float | None:
        """Mean of the last ``last_k`` curve points (None when no episode completed)."""
        tail = [r for _, r in self.points[-last_k:]]
        return sum(tail) / len(tail) if tail else None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "env_steps": self.env_steps,
            "points": list(self.points),
            "lag": (self.lag_sum, self.lag_count, self.lag_max),
            "sampler": (self.sampler_steps, self.sampler_busy_s),
            "wall_s": self.wall_s,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.env_steps = int(state_dict["env_steps"])
        self.points = [(int(s), float(r)) for s, r in state_dict["points"]]
        self.lag_sum, self.lag_count, self.lag_max = state_dict["lag"]
        self.sampler_steps, self.sampler_busy_s = state_dict["sampler"]
        self.wall_s = float(state_dict["wall_s"])
