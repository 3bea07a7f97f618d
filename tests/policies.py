"""Policies for tests that run them in spawned processes (module-level, so children unpickle them).

``GreedyMLP`` / ``GreedyVLA`` act greedily (``deterministic=True``) whatever the caller asks: a
sampler samples with its own RNG, an inference worker with another, so sampled actions of the two
paths cannot be compared; the greedy action of the same weights on the same observation can.
``AuditedMLP`` records the weights behind every forward.
"""

from __future__ import annotations

import torch

from benchmarks.checksums import weights_checksum
from fastlight.models.action_mapping import IdentityActions
from fastlight.models.base import ActOutput, EvalOutput
from fastlight.models.mlp import MLPActorCritic
from fastlight.vla.policy import VLAPolicy


class GreedyMLP(MLPActorCritic):
    def act(self, obs, *, step=None, deterministic=False):
        return super().act(obs, step=step, deterministic=True)


class GreedyVLA(VLAPolicy):
    def act(self, obs, *, step=None, deterministic=False):
        return super().act(obs, step=step, deterministic=True)


class AuditedMLP(MLPActorCritic):
    """Appends the checksum of the weights behind every ``act`` to the file ``audit_path``.

    What the inference worker's forwards used, seen from inside the policy: a forward on a
    half-updated model would record a checksum no published version has.
    """

    def __init__(self, *args, audit_path: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.audit_path = audit_path

    def act(self, obs, *, step=None, deterministic=False):
        with open(self.audit_path, "a") as f:
            f.write(f"{weights_checksum(self)!r}\n")
        return super().act(obs, step=step, deterministic=deterministic)


class ObsValuePolicy(torch.nn.Module):
    """Deterministic policy for bookkeeping tests: action 0, logprob 0, V(s) = 10*tag + step."""

    obs_dim = 3
    action_dim = 2
    continuous = False

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def _v(self, obs):
        return 10 * obs[:, 0] + obs[:, 1]

    def act(self, obs, *, step=None, deterministic=False):
        n = obs.shape[0]
        return ActOutput(torch.zeros(n, dtype=torch.long), torch.zeros(n), self._v(obs))

    def evaluate(self, obs, actions, *, step=None):
        n = obs.shape[0]
        return EvalOutput(torch.zeros(n) + self.w, torch.zeros(n), self._v(obs))

    def value(self, obs, *, step=None):
        return self._v(obs)

    def action_mapping(self):
        return IdentityActions()

    def env_action(self, actions):
        return actions
