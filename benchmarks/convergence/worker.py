"""One training run of the convergence benchmark, in its own process:
``python -m benchmarks.convergence.worker <run.json>``.

fastlight's trainer path as ``fastlight fit`` runs it - ``RolloutDataModule`` with its sampler
processes, ``RLModule`` (PPO + SMPO), Lightning's ``Trainer`` - plus :class:`WallClockSnapshots`,
which saves the policy every ``every_s`` seconds of training and stops the run after ``budget_s``.
Writes ``summary.json`` (updates, valid transitions, training time) next to the snapshots.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Same PPO settings for every mode (configs/highway_dpsa.yaml's).
PPO = {"lr": 5.0e-4, "gamma": 0.9, "update_epochs": 4, "num_minibatches": 4}


@dataclass
class RunConfig:
    """Everything one run needs (JSON on the command line of the worker)."""

    env_id: str
    mode: str
    clips: int
    workers: int
    seed: int
    budget_s: float
    every_s: float
    valid_steps_per_update: int
    scenario_load_cost_s: float
    folder: str
    threshold: float = 0.5
    model: dict[str, Any] = field(default_factory=lambda: dict(PPO))

    @property
    def label(self) -> str:
        return f"dpsa{self.threshold:g}" if self.mode == "dpsa" else self.mode

    def datamodule_kwargs(self) -> dict[str, Any]:
        """Equal valid transitions per update in every mode: dpsa / sgr collect whole cycles until
        the budget (``valid_steps_per_step``); autoreset / sequential collect ``rollout_steps`` per
        env, sized so that one round of every env is the budget."""
        from fastlight.envs.scenario_cost import ScenarioLoadCost
        from fastlight.fleet.faults import FaultSettings

        load = self.scenario_load_cost_s
        num_envs = 1 if self.mode == "sequential" else self.clips
        cyclic = self.mode in ("dpsa", "sgr")
        return {
            "env_id": self.env_id,
            "num_envs": num_envs,
            "num_workers": min(self.workers, num_envs),
            "reset_mode": self.mode,
            "termination_threshold": self.threshold,
            "rollout_steps": 1 if cyclic else math.ceil(self.valid_steps_per_update / num_envs),
            "valid_steps_per_step": self.valid_steps_per_update if cyclic else None,
            "env_wrappers": [ScenarioLoadCost(load)] if load > 0 else None,
            "seed": self.seed,
            "steps_per_epoch": 1_000_000,
            "faults": FaultSettings(worker_timeout_s=300.0),
            "rank_rounds": "apart",  # each process's clips alone, as the recorded runs were measured
        }


def train(cfg: RunConfig) -> dict[str, Any]:
    import lightning as L
    import torch

    from benchmarks.convergence.snapshots import WallClockSnapshots
    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.modules.rl_module import RLModule

    torch.set_num_threads(1)  # the samplers need the cores
    L.seed_everything(cfg.seed, verbose=False)
    folder = Path(cfg.folder)
    dm = RolloutDataModule(**cfg.datamodule_kwargs())
    module = RLModule(obs_dim=dm.obs_dim, action_dim=dm.action_dim, continuous=dm.continuous, **cfg.model)
    snaps = WallClockSnapshots(folder, every_s=cfg.every_s, budget_s=cfg.budget_s)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[snaps],
    )
    t0 = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    summary = {
        **asdict(cfg),
        "label": cfg.label,
        "updates": snaps.updates,
        "valid_steps": snaps.valid_steps,
        "train_s": snaps.elapsed,
        "fit_s": time.perf_counter() - t0,
        "snapshots": snaps.snapshots,
        "obs_dim": dm.obs_dim,
        "action_dim": dm.action_dim,
        "continuous": dm.continuous,
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cfg = RunConfig(**json.loads(Path(argv[0]).read_text()))
    train(cfg)


if __name__ == "__main__":
    main()
