"""``WallClockSnapshots``: the policy's weights every ``every_s`` seconds of training wall-clock, and a
stop once ``budget_s`` of it have passed, for the convergence benchmark's evaluation afterwards.

The clock starts when the first Rollout reaches the training step (process start-up and imports
of the samplers are the same work in every reset mode, and on a loaded machine they would eat a
short budget) and excludes the time spent writing snapshots, so a run's curve is return against
the training time it actually had.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from typing_extensions import override

from fastlight.data.protocols import TrainsPolicy, require
from fastlight.rollout import Rollout


class WallClockSnapshots(L.Callback):
    """Saves ``snap_<k>.pt`` = ``{policy, t, updates, valid_steps}`` into ``folder`` at t = 0,
    every ``every_s`` of training time, and at the stop (after ``budget_s``)."""

    def __init__(self, folder: str | Path, *, every_s: float, budget_s: float) -> None:
        if not 0 < every_s <= budget_s:
            raise ValueError(f"WallClockSnapshots needs 0 < every_s <= budget_s, got {every_s}, {budget_s}")
        self.folder = Path(folder)
        self.every_s = every_s
        self.budget_s = budget_s
        self.updates = 0
        self.valid_steps = 0
        self.snapshots = 0
        self.elapsed = 0.0
        self._t0 = 0.0
        self._excluded = 0.0

    def _clock(self) -> float:
        return time.perf_counter() - self._t0 - self._excluded

    def _save(self, module: Any) -> None:
        t = time.perf_counter()
        state = {k: v.detach().cpu().clone() for k, v in module.policy.state_dict().items()}
        payload = {
            "policy": state,
            "t": self.elapsed,
            "updates": self.updates,
            "valid_steps": self.valid_steps,
        }
        torch.save(payload, self.folder / f"snap_{self.snapshots:04d}.pt")
        self.snapshots += 1
        self._excluded += time.perf_counter() - t

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        require(pl_module, TrainsPolicy, who="WallClockSnapshots", what="a LightningModule")
        self.folder.mkdir(parents=True, exist_ok=True)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.snapshots == 0:  # the first Rollout has arrived: the clock starts
            self._t0, self._excluded = time.perf_counter(), 0.0
            self._save(pl_module)  # t = 0: the initial policy

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.updates += 1
        if isinstance(batch, Rollout):
            self.valid_steps += int(batch.stats.valid_steps)
        self.elapsed = self._clock()
        if self.elapsed >= self.budget_s:
            trainer.should_stop = True
            self._save(pl_module)
        elif self.elapsed >= self.snapshots * self.every_s:
            self._save(pl_module)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "updates": self.updates,
            "valid_steps": self.valid_steps,
            "snapshots": self.snapshots,
            "elapsed": self.elapsed,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.updates = int(state_dict["updates"])
        self.valid_steps = int(state_dict["valid_steps"])
        self.snapshots = int(state_dict["snapshots"])
        self.elapsed = float(state_dict["elapsed"])


def run_policy(summary: dict[str, Any]) -> torch.nn.Module:
    """The (untrained) policy of a convergence run, from its ``summary.json``: the RLModule the
    worker built (same sizes and settings), in eval mode, to load a snapshot's weights into."""
    from fastlight.modules.rl_module import RLModule

    module = RLModule(
        obs_dim=summary["obs_dim"],
        action_dim=summary["action_dim"],
        continuous=summary["continuous"],
        **summary["model"],
    )
    module.configure_model()
    return module.policy.eval()


def is_snapshot(path: str | Path) -> bool:
    """A ``snap_<k>.pt`` of a finished convergence run (its ``summary.json`` next to it)."""
    path = Path(path)
    return path.name.startswith("snap_") and path.suffix == ".pt" and (path.parent / "summary.json").is_file()


def load_snapshot(path: str | Path) -> tuple[torch.nn.Module, dict[str, Any], dict[str, Any]]:
    """``(policy with the snapshot's weights, the run's summary, the snapshot's t/updates/valid_steps)``."""
    import json

    path = Path(path)
    summary = json.loads((path.parent / "summary.json").read_text())
    snap = torch.load(path, map_location="cpu", weights_only=True)
    policy = run_policy(summary)
    policy.load_state_dict(snap["policy"])
    return policy, summary, {k: v for k, v in snap.items() if k != "policy"}
