"""Critic heads over a VLA's hidden states (AcceRL §value head).

:class:`ActionAwareValueHead` is AcceRL's *Action-Aware Attention Pooling* critic:

1. the last-layer hidden states at the ``K`` action-token positions, ``h [N, K, H]``, **detached** (value
   gradients never reach the backbone), are scored, ``alpha = softmax_K(h W_s)`` ``[N, K]``;
2. pooled, ``p = sum_k alpha_k h_k`` ``[N, H]``;
3. ``V = MLP(p + E[t])`` ``[N]``, ``E[t]`` a learned embedding of the episode step ``t`` (clamped into
   ``[0, max_episode_steps)``): the value depends on the remaining horizon.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ActionAwareValueHead(nn.Module):
    """AcceRL value head: attention pooling over detached action-token states + step embedding + MLP.

    Args:
        hidden_size: ``H``, the backbone's hidden size.
        max_episode_steps: size of the step-embedding table; larger steps are clamped to the last row.
        mlp_hidden: width of the MLP's hidden layer.
    """

    def __init__(self, hidden_size: int, max_episode_steps: int, mlp_hidden: int = 256) -> None:
        super().__init__()
        sizes = {"hidden_size": hidden_size, "max_episode_steps": max_episode_steps, "mlp_hidden": mlp_hidden}
        for name, val in sizes.items():
            if val < 1:
                raise ValueError(f"{name} must be >= 1, got {val}")
        self.hidden_size, self.max_episode_steps = hidden_size, max_episode_steps
        self.score = nn.Linear(hidden_size, 1, bias=False)  # no bias: softmax is shift-invariant
        self.step_embedding = nn.Embedding(max_episode_steps, hidden_size)
        h, m = hidden_size, mlp_hidden
        self.mlp = nn.Sequential(nn.Linear(h, m), nn.GELU(), nn.Linear(m, m), nn.GELU(), nn.Linear(m, 1))
        nn.init.normal_(self.step_embedding.weight, std=0.02)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        # An older checkpoint's ``score.bias`` never changed a value (softmax is shift-invariant): dropped.
        state_dict.pop(prefix + "score.bias", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def pool(self, hidden: Tensor) -> Tensor:
        """Detached attention pooling: ``hidden [N, K, H] -> pooled [N, H]``."""
        if hidden.dim() != 3 or hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden must be [N, K, H={self.hidden_size}], got shape {tuple(hidden.shape)}")
        h = hidden.detach().to(self.score.weight.dtype)
        alpha = torch.softmax(self.score(h).squeeze(-1), dim=-1)  # [N, K]
        return torch.einsum("nk,nkh->nh", alpha, h)

    def forward(self, hidden: Tensor, step: Tensor | None = None) -> Tensor:
        """``hidden [N, K, H]`` (detached here), ``step [N]`` long (``None``: 0) -> values ``[N]``."""
        pooled = self.pool(hidden)
        n = pooled.shape[0]
        if step is None:
            step = torch.zeros(n, dtype=torch.long, device=pooled.device)
        step = torch.as_tensor(step, device=pooled.device)
        if step.shape != (n,):
            raise ValueError(
                f"step must be [N={n}], got shape {tuple(step.shape)} (hidden {tuple(hidden.shape)})"
            )
        t = step.long().clamp(0, self.max_episode_steps - 1)
        return self.mlp(pooled + self.step_embedding(t)).squeeze(-1).clone()  # not a view: see token_logprobs
