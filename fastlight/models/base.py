"""The policy interface every fastlight module and sampler talks to.

A policy is an ``nn.Module`` with three methods over a flat batch ``[N, ...]`` of observations
(a tensor, or a dict of tensors for multi-modal inputs) and the episode step index ``step``
(``[N]`` long; policies that do not use it ignore it):

- ``act(obs, step=..., deterministic=False) -> ActOutput``: sample actions for acting;
- ``evaluate(obs, actions, step=...) -> EvalOutput``: log-probs, entropy and values of given
  actions, with gradients, for the loss;
- ``value(obs, step=...) -> Tensor [N]``: the critic alone (value recomputation, bootstrap).

``logprobs`` and ``entropy`` are ``[N]`` for single-distribution policies and ``[N, K]`` for
token policies (one entry per action token), which is what token-level ratios need.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

from torch import Tensor

Obs = Tensor | dict[str, Tensor]


class ActOutput(NamedTuple):
    actions: Tensor
    logprobs: Tensor
    values: Tensor


class EvalOutput(NamedTuple):
    logprobs: Tensor
    entropy: Tensor
    values: Tensor


@runtime_checkable
class Policy(Protocol):
    def act(self, obs: Obs, *, step: Tensor | None = None, deterministic: bool = False) -> ActOutput: ...

    def evaluate(self, obs: Obs, actions: Tensor, *, step: Tensor | None = None) -> EvalOutput: ...

    def value(self, obs: Obs, *, step: Tensor | None = None) -> Tensor: ...
