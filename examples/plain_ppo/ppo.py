"""A plain Lightning PPO project on CartPole-v1, written without fastlight.

In the style of Lightning's own PPO template: the LightningModule owns the env and the
actor-critic, and an ``IterableDataset`` yields ``(obs, action, old_logp, return, advantage)``
tuples (``experience.py``). ``ppo_callbacks.py`` is this file with fastlight's callbacks, and
``ppo_fastlight.py`` that one on fastlight's DataModule and losses (the README shows both diffs):

    python -m examples.plain_ppo.ppo
"""

from __future__ import annotations

import gymnasium as gym
import lightning as L
import torch
from torch.utils.data import DataLoader

from examples.plain_ppo.experience import ActorCritic, Experience, ExperienceSourceDataset


class PPOLightning(L.LightningModule):
    """PPO: ``steps_per_epoch`` env steps, then clipped-surrogate steps on minibatches of them."""

    def __init__(
        self,
        env: str = "CartPole-v1",
        gamma: float = 0.99,
        lam: float = 0.95,
        lr: float = 3e-4,
        batch_size: int = 64,
        steps_per_epoch: int = 512,
        clip_ratio: float = 0.2,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        environment = gym.make(env)
        self.agent = ActorCritic(environment.observation_space.shape[0], int(environment.action_space.n))
        self.experience = Experience(
            environment, self.agent, steps_per_epoch=steps_per_epoch, gamma=gamma, lam=lam, seed=seed
        )

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        h = self.hparams
        obs, action, old_logp, qval, adv = batch
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        logp, entropy, value = self.agent.evaluate(obs, action)
        ratio = (logp - old_logp).exp()
        loss_actor = -torch.min(ratio * adv, ratio.clamp(1 - h.clip_ratio, 1 + h.clip_ratio) * adv).mean()
        loss_critic = (qval - value).pow(2).mean()
        losses = {"policy_loss": loss_actor, "value_loss": loss_critic, "entropy": entropy.mean()}
        self.log_dict({f"losses/{k}": v for k, v in losses.items()}, batch_size=len(obs))
        ended = self.experience.episode_returns
        if ended:
            mean_return = sum(ended) / len(ended)
            self.log("charts/episodic_return", mean_return, prog_bar=True, batch_size=1)
        return loss_actor + 0.5 * loss_critic

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.agent.parameters(), lr=self.hparams.lr)

    def train_dataloader(self) -> DataLoader:
        dataset = ExperienceSourceDataset(self.experience.samples)
        return DataLoader(dataset, batch_size=self.hparams.batch_size)


def main(max_steps: int = 2000, root: str = "runs/plain_ppo") -> L.Trainer:
    model = PPOLightning()
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        log_every_n_steps=1,
        default_root_dir=root,
    )
    trainer.fit(model)
    return trainer


if __name__ == "__main__":
    import sys

    main(*(int(a) for a in sys.argv[1:2]))  # an optional max_steps: `python -m ... 64` is a short run
