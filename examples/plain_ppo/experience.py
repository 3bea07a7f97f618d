"""The plain project's sampler and network (no fastlight): one env, one step at a time.

``Experience.samples`` plays ``steps_per_epoch`` steps with the current actor, then yields one
``(obs, action, old_logp, return, advantage)`` tuple per step, as Lightning's PPO template does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import gymnasium as gym
import torch
from torch import nn
from torch.distributions import Categorical
from torch.utils.data import IterableDataset


class ExperienceSourceDataset(IterableDataset):
    """Yields what ``generate_batch()`` yields: one tuple per environment step."""

    def __init__(self, generate_batch: Callable[[], Iterator[tuple]]) -> None:
        self.generate_batch = generate_batch

    def __iter__(self) -> Iterator[tuple]:
        return self.generate_batch()


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, n_actions))
        self.critic = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dist = Categorical(logits=self.actor(obs))
        return dist.log_prob(actions), dist.entropy(), self.critic(obs).squeeze(-1)


class Experience:
    """Plays ``env`` with ``agent``; keeps the returns of the last 10 finished episodes."""

    def __init__(
        self, env: gym.Env, agent: ActorCritic, *, steps_per_epoch: int, gamma: float, lam: float, seed: int
    ) -> None:
        self.env, self.agent = env, agent
        self.steps_per_epoch, self.gamma, self.lam = steps_per_epoch, gamma, lam
        self.obs, _ = env.reset(seed=seed)
        self.episode_return = 0.0
        self.episode_returns: deque[float] = deque(maxlen=10)

    def samples(self) -> Iterator[tuple]:
        """``steps_per_epoch`` steps with their GAE(gamma, lam) advantages (a time-limit
        truncation counts as an end, as in Lightning's template)."""
        steps = []
        with torch.no_grad():
            for _ in range(self.steps_per_epoch):
                obs = torch.as_tensor(self.obs, dtype=torch.float32)
                dist = Categorical(logits=self.agent.actor(obs))
                action = dist.sample()
                self.obs, reward, terminated, truncated, _ = self.env.step(int(action))
                steps.append((obs, action, dist.log_prob(action), float(reward), terminated or truncated))
                self.episode_return += float(reward)
                if terminated or truncated:
                    self.episode_returns.append(self.episode_return)
                    self.episode_return = 0.0
                    self.obs, _ = self.env.reset()
            obs = torch.stack([s[0] for s in steps])
            values = self.agent.critic(obs).squeeze(-1).tolist()
            last = self.agent.critic(torch.as_tensor(self.obs, dtype=torch.float32)).item()
        advantage, samples = 0.0, []
        for t in reversed(range(len(steps))):
            _, action, logp, reward, done = steps[t]
            next_value = 0.0 if done else values[t + 1] if t + 1 < len(steps) else last
            delta = reward + self.gamma * next_value - values[t]
            advantage = delta + (0.0 if done else self.gamma * self.lam * advantage)
            ret = advantage + values[t]
            samples.append((obs[t], action, logp, torch.tensor(ret), torch.tensor(advantage)))
        yield from reversed(samples)
