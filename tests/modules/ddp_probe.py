"""A callback for multi-rank tests: each rank writes its parameter checksum, seeds and counters (json) and
its whole weights (``rank{r}.pt``) at the end of fit."""

from __future__ import annotations

import json
import os

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from fastlight.weights.sharded import full


class DumpRankState(Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.steps = 0

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        """The gradients of the first optimizer step (averaged over the ranks; whole tensors), as
        ``grads{r}.pt``."""
        self.steps += 1
        if self.steps == 1:
            named = pl_module.policy.named_parameters()
            grads = {k: full(p.grad).cpu() for k, p in named if p.grad is not None}
            os.makedirs(self.out_dir, exist_ok=True)
            torch.save(grads, os.path.join(self.out_dir, f"grads{trainer.global_rank}.pt"))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dm = trainer.datamodule
        # Whole tensors under any strategy (an fsdp2 rank holds shards: gathered, on every rank).
        weights = {k: full(p.detach()).cpu() for k, p in pl_module.policy.named_parameters()}
        state = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "checksum": sum(float(w.double().sum()) * (i + 1) for i, w in enumerate(weights.values())),
            "version": pl_module.policy_version,
            "seeds": [c.seed for c in dm.sampler_configs(trainer.global_rank)],
            "dwr_weights": [
                c.weights().tolist()
                for c in trainer.callbacks
                if type(c).__name__ == "DynamicWeightedResampling"
            ],
            "dwr_outcomes": [
                sum(len(w) for w in c.outcomes)
                for c in trainer.callbacks
                if type(c).__name__ == "DynamicWeightedResampling"
            ],
            # The latest evaluation each rank logged (PeriodicEvaluation's), and its best score.
            "evaluations": [
                {"last": c.last, "best": c.best, "count": c.evaluations}
                for c in trainer.callbacks
                if type(c).__name__ == "PeriodicEvaluation"
            ],
            # This rank's own sampler counts (RolloutThroughput's totals).
            "throughput_totals": [
                dict(c.totals) for c in trainer.callbacks if type(c).__name__ == "RolloutThroughput"
            ],
        }
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, f"rank{trainer.global_rank}.json"), "w") as f:
            json.dump(state, f)
        torch.save(weights, os.path.join(self.out_dir, f"rank{trainer.global_rank}.pt"))
