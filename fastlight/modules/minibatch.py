"""Flat views of a Rollout for the update loop, and value recomputation."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fastlight.rollout import Obs, Rollout


def index_obs(obs: Obs, idx: Tensor) -> Obs:
    if isinstance(obs, dict):
        return {k: v[idx] for k, v in obs.items()}
    return obs[idx]


@dataclass
class Minibatch:
    """Transitions flattened over ``[T, E]`` to ``[N, ...]`` (one minibatch, or all of them)."""

    obs: Obs
    actions: Tensor
    logprobs: Tensor
    values: Tensor
    advantages: Tensor
    returns: Tensor
    valid: Tensor
    step: Tensor
    task_id: Tensor

    @staticmethod
    def from_rollout(rollout: Rollout, advantages: Tensor, returns: Tensor, values: Tensor) -> Minibatch:
        flat = {k: rollout.flat(k) for k in ("obs", "actions", "logprobs", "valid", "step", "task_id")}
        return Minibatch(
            **flat, values=values.reshape(-1), advantages=advantages.reshape(-1), returns=returns.reshape(-1)
        )

    def select(self, idx: Tensor) -> Minibatch:
        return Minibatch(**{name: index_obs(value, idx) for name, value in vars(self).items()})


@torch.no_grad()
def recompute_values(policy: nn.Module, rollout: Rollout, *, chunk: int = 4096) -> Tensor:
    """V(s_t) from the *current* critic for every step, ``[T, E]``, 0 on padding (AcceRL §value
    recomputation). Bootstrap values of truncated steps keep their sampled value."""
    t_len, n_env = rollout.shape
    obs, step = rollout.flat("obs"), rollout.flat("step")
    n = t_len * n_env
    out = []
    for start in range(0, n, chunk):
        idx = torch.arange(start, min(start + chunk, n), device=rollout.valid.device)
        out.append(policy.value(index_obs(obs, idx), step=step[idx]).float())
    values = torch.cat(out).reshape(t_len, n_env)
    return torch.where(rollout.valid, values, torch.zeros_like(values))
