"""Action tokens from a :class:`~fastlight.vla.policy.VLAPolicy`'s logits: the decoding modes, the choice
of a token and its log-probability (one entry per token: AcceRL's token-level ratios).

- ``"parallel"`` (OpenVLA-OFT): the K slots are learned placeholder embeddings; one forward gives all K
  action-token distributions at once, each conditioned on the observation only.
- ``"autoregressive"``: slot 0 is the first placeholder and slot ``k >= 1`` is the input embedding of the
  previous action token ``a_{k-1}``; ``evaluate`` teacher-forces the given actions in one forward,
  ``act`` samples token by token (``K`` forwards, no KV cache).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor
from torch.distributions import Categorical

#: How the action tokens of one policy call are decoded (see the module docstring).
Decoding = Literal["parallel", "autoregressive"]
DECODING_MODES: tuple[str, ...] = get_args(Decoding)


def choose(logits: Tensor, deterministic: bool) -> Tensor:
    """Logits ``[N, k, B]`` -> bins ``[N, k]``: argmax, or one Categorical sample per token."""
    return logits.argmax(-1) if deterministic else Categorical(logits=logits).sample()


def token_logprobs(logits: Tensor, actions: Tensor) -> Tensor:
    """``log softmax(logits)[actions]``: ``[N, k, B]`` and ``[N, k]`` -> ``[N, k]``, a tensor of its own
    (not a view: FSDP2 warns about a view a policy method returns, ``MLPActorCritic._value``)."""
    return torch.log_softmax(logits, dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1).clone()
