"""Evaluation episodes for a trained policy (or a uniform-random baseline).

Episodes run to their natural end (termination or the env's own time limit): no DPSA
truncation here, so returns are comparable across policies and with the literature.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from fastlight.envs.registry import make_env
from fastlight.rollout import EpisodeRecord
from fastlight.sampling.obs import action_to_env, obs_to_tensor

ActFn = Callable[[Any, int], Any]


def policy_act_fn(policy: torch.nn.Module, *, deterministic: bool = False) -> ActFn:
    """An ``(obs, step) -> env action`` function from a fastlight policy."""

    @torch.no_grad()
    def act(obs: Any, step: int) -> Any:
        batch = obs_to_tensor(
            np.asarray(obs)[None]
            if not isinstance(obs, dict)
            else {k: np.asarray(v)[None] for k, v in obs.items()}
        )
        out = policy.act(batch, step=torch.tensor([step]), deterministic=deterministic)
        return action_to_env(policy, out.actions)[0]

    return act


def random_act_fn(env: gym.Env, seed: int) -> ActFn:
    env.action_space.seed(seed)
    return lambda obs, step: env.action_space.sample()


def run_episodes(
    env_id: str,
    act_fn: ActFn | None,
    *,
    episodes: int = 20,
    seed: int = 10_000,
    env_kwargs: dict[str, Any] | None = None,
) -> list[EpisodeRecord]:
    """Play ``episodes`` episodes with seeds ``seed, seed+1, ...``; ``act_fn=None`` acts at random."""
    env = make_env(env_id, env_kwargs=env_kwargs)
    act = act_fn or random_act_fn(env, seed)
    records = []
    for i in range(episodes):
        obs, info = env.reset(seed=seed + i)
        ret, steps, done = 0.0, 0, False
        while not done:
            obs, reward, term, trunc, info = env.step(act(obs, steps))
            ret += float(reward)
            steps += 1
            done = term or trunc
        records.append(
            EpisodeRecord(
                length=steps,
                ret=ret,
                terminated=bool(term),
                truncated=bool(trunc),
                crashed=bool(info.get("crashed", False)),
                success=bool(info.get("success", False)),
            )
        )
    env.close()
    return records
