"""Attaching fastlight's callbacks to a Lightning project you already have.

fastlight's callbacks only need batches that are ``Rollout``s, so an existing Lightning
training script keeps its Trainer, loggers and checkpointing and adds, e.g.:

    python examples/attach_callbacks.py

From the command line the same is one config fragment:

    fastlight fit --config configs/highway_dpsa.yaml --config callbacks/throughput.yaml

(``highway_dpsa.yaml`` already has ``RolloutThroughput``: the fragment then updates that one.)
"""

from __future__ import annotations

import lightning as L

from fastlight.callbacks.throughput import RolloutThroughput
from fastlight.data.datamodule import RolloutDataModule
from fastlight.modules.rl_module import RLModule


def main(max_steps: int = 160) -> L.Trainer:
    data = RolloutDataModule(env_id="highway-fast-v0", num_envs=4, num_workers=1)
    model = RLModule(obs_dim=data.obs_dim, action_dim=data.action_dim, continuous=data.continuous)
    trainer = L.Trainer(
        max_steps=max_steps,
        callbacks=[RolloutThroughput()],
        # Lightning's log_every_n_steps counts training batches, and a batch here is a whole
        # rollout (its default, 50, would log once per 50 rollouts): log every rollout.
        log_every_n_steps=1,
        accelerator="cpu",
        default_root_dir="runs/attach_example",
    )
    trainer.fit(model, datamodule=data)
    return trainer


if __name__ == "__main__":
    main()
