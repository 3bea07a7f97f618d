"""``ppo_callbacks.py`` on fastlight's ``RolloutDataModule`` and SMPO losses.

The module keeps its shape (hparams, ``training_step``, optimizer) but no longer samples: the
DataModule's sampler processes play the env with DPSA and hand over one padded ``[T, E]``
Rollout per training step. What the module must expose for that is typed in
``fastlight.data.protocols.RolloutPolicyModule``: ``policy`` (a ``fastlight.models.base.Policy``,
here fastlight's MLP) and ``policy_version``, increased after each update (new weights reach the
samplers when it changes; a version that stays put is reported after the next step). The losses
are masked means over the valid steps (FAST §SMPO), so padding has no effect on them:

    python -m examples.plain_ppo.ppo_fastlight
"""

from __future__ import annotations

import lightning as L
import torch

from fastlight.advantages import masked_gae, normalize_advantages
from fastlight.callbacks.throughput import RolloutThroughput
from fastlight.data.datamodule import RolloutDataModule
from fastlight.losses import ppo_clip_loss, value_loss
from fastlight.models.mlp import MLPActorCritic
from fastlight.rollout import Rollout


class PPOLightning(L.LightningModule):
    """PPO: one clipped-surrogate step per Rollout from the DataModule's samplers."""

    def __init__(
        self,
        obs_dim: int = 4,
        n_actions: int = 2,
        gamma: float = 0.99,
        lam: float = 0.95,
        lr: float = 3e-4,
        clip_ratio: float = 0.2,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.policy = MLPActorCritic(obs_dim, n_actions, hidden_sizes=(64,))
        self.policy_version = 0

    def training_step(self, batch: Rollout, batch_idx: int) -> torch.Tensor:
        h, b = self.hparams, batch
        adv, qval = masked_gae(rewards=b.rewards, values=b.values, bootstrap_values=b.bootstrap_values,
                               terminated=b.terminated, truncated=b.truncated, valid=b.valid,
                               gamma=h.gamma, lam=h.lam)
        adv, valid = normalize_advantages(adv, b.valid).flatten(), b.valid.flatten()
        logp, entropy, value = self.policy.evaluate(b.obs.flatten(0, 1), b.actions.flatten(0, 1))
        old_logp = b.logprobs.flatten()
        loss_actor, _ = ppo_clip_loss(logprobs=logp, old_logprobs=old_logp, advantages=adv, valid=valid,
                                      clip_eps=h.clip_ratio)
        loss_critic = value_loss(values=value, returns=qval.flatten(), valid=valid)
        losses = {"policy_loss": loss_actor, "value_loss": loss_critic, "entropy": entropy[valid].mean()}
        self.log_dict({f"losses/{k}": v for k, v in losses.items()}, batch_size=int(valid.sum()))
        ended = [e.ret for e in b.stats.episodes if not e.cut]  # not the ones a DPSA truncation cut
        if ended:
            mean_return = sum(ended) / len(ended)
            self.log("charts/episodic_return", mean_return, prog_bar=True, batch_size=1)
        self.policy_version += 1  # published before the next batch, i.e. after this optimizer step
        return loss_actor + 0.5 * loss_critic

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.policy.parameters(), lr=self.hparams.lr)


def main(max_steps: int = 2000, root: str = "runs/plain_ppo") -> L.Trainer:
    data = RolloutDataModule(env_id="CartPole-v1", num_envs=4, num_workers=1, max_horizon=128)
    model = PPOLightning(obs_dim=data.obs_dim, n_actions=data.action_dim)
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        log_every_n_steps=1,
        default_root_dir=root,
        callbacks=[RolloutThroughput()],
    )
    trainer.fit(model, datamodule=data)
    return trainer


if __name__ == "__main__":
    import sys

    main(*(int(a) for a in sys.argv[1:2]))  # an optional max_steps: `python -m ... 64` is a short run
