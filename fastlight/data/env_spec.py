"""``EnvSpec``: what a policy must match in an env (flattened obs size, action size and kind)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import gymnasium as gym

from fastlight.data.protocols import MultiTaskEnv


@dataclass(frozen=True)
class EnvSpec:
    """What the policy must match: flattened obs size, action size, action kind.

    ``observation_space`` is the env's own space, for policies over dict observations (their
    ``obs_dim`` is 0) to check keys and shapes (e.g. ``VLAModule.check_env_spec``).
    """

    obs_dim: int
    action_dim: int
    continuous: bool
    observation_space: gym.Space | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def from_env(env: gym.Env) -> EnvSpec:
        obs_space, act_space = env.observation_space, env.action_space
        obs_dim = int(math.prod(obs_space.shape)) if obs_space.shape else 0
        if isinstance(act_space, gym.spaces.Discrete):
            return EnvSpec(obs_dim, int(act_space.n), False, obs_space)
        if isinstance(act_space, gym.spaces.Box):
            return EnvSpec(obs_dim, int(math.prod(act_space.shape)), True, obs_space)
        raise ValueError(f"unsupported action space {act_space}: fastlight supports Discrete and Box")


def task_names_of(env: gym.Env) -> tuple[str, ...] | None:
    """The task names of a multi-task env (one that takes task weights), else None."""
    base = env.unwrapped
    if not isinstance(base, MultiTaskEnv):
        return None
    return tuple(str(n) for n in base.task_names)
