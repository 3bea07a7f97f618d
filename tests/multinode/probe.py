"""``NodeProbe``: a callback that records, per rank, what the two-node tests compare across ranks.

    fastlight fit ... --trainer.callbacks+=tests.multinode.probe.NodeProbe --trainer.callbacks.out DIR

After every update it records a hash of the module's weights, the env steps this rank's samplers
collected for it (``Rollout.stats.valid_steps``), a hash of the Rollout's observations and the
task outcomes this rank saw (the rows DWR pools). At the end of the fit it writes ``DIR/rank<r>.json``
with those, the seeds the rank's samplers were given, its node rank, the job's pooled ``env_steps``
(EnvStepBudget) and DWR windows. (``tests/multinode/test_two_nodes.py`` reads them.)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from fastlight.callbacks.dwr import DynamicWeightedResampling
from fastlight.callbacks.env_steps import EnvStepBudget
from fastlight.rollout import Rollout


def weights_hash(state_dict: dict[str, Any]) -> str:
    """sha256 over the names, dtypes, shapes and bytes of a dict's tensors (a state dict, a dict
    observation), in key order."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        value = state_dict[name]
        if not isinstance(value, torch.Tensor):
            continue
        t = value.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # reshape: a 0-d tensor has no view
    return h.hexdigest()


class NodeProbe(Callback):
    """Records this rank's view of the run into ``out/rank<global_rank>.json`` (see the module doc)."""

    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out
        self.hashes: list[str] = []
        self.valid_steps: list[int] = []
        self.obs_hashes: list[str] = []
        self.outcomes: list[list[list[int]]] = []
        self.seeds: list[int] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The seeds the samplers were started with: the pool's own configs, not a recomputation.
        pool = getattr(trainer.datamodule, "pool", None)
        self.seeds = [int(c.seed) for c in pool.configs] if pool is not None else []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(batch, Rollout):
            return
        self.hashes.append(weights_hash(pl_module.state_dict()))
        self.valid_steps.append(int(batch.stats.valid_steps))
        obs = batch.obs if isinstance(batch.obs, dict) else {"obs": batch.obs}  # a VLA's obs is a dict
        self.obs_hashes.append(weights_hash(obs))
        # As DWR takes them: episodes that ended by themselves, success as 0/1.
        ended = [e for e in batch.stats.episodes if not e.cut]
        self.outcomes.append([[int(e.task_id), int(e.success is True)] for e in ended])

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        env_steps = [cb.env_steps for cb in trainer.callbacks if isinstance(cb, EnvStepBudget)]
        dwr = [cb for cb in trainer.callbacks if isinstance(cb, DynamicWeightedResampling)]
        report = {
            "global_rank": trainer.global_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "env_node_rank": os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK")),
            "pid": os.getpid(),
            "seeds": self.seeds,
            "hashes": self.hashes,
            "final_hash": weights_hash(pl_module.state_dict()),
            "valid_steps": self.valid_steps,
            "obs_hashes": self.obs_hashes,
            "outcomes": self.outcomes,
            "env_steps": env_steps[0] if env_steps else None,
            "dwr_window": dwr[0].window if dwr else None,
            "dwr_outcomes": [[int(ok) for ok in w] for w in dwr[0].outcomes] if dwr else None,
            "policy_version": int(pl_module.policy_version),
            "global_step": trainer.global_step,
        }
        out = Path(self.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))
