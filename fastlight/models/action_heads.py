"""``ActionHead``: the action distribution over an actor's outputs, for each kind of action space.

- ``discrete N``: one Categorical over ``N`` logits; actions ``[N]`` long;
- ``box D``: a diagonal Gaussian with a state-independent log-std; actions ``[N, D]`` float;
- ``multidiscrete AxB...``: one Categorical per entry (``A + B + ...`` logits); actions ``[N, k]`` long;
- ``multibinary K``: ``K`` independent Bernoullis (``K`` logits); actions ``[N, K]`` long (0 / 1).

Log-probs and entropies are summed over an action's entries (factorised distributions), so they are
``[N]`` for every kind and the objectives see one ratio per action, as with a single Categorical.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.distributions import Bernoulli, Categorical, Normal

from fastlight.models.action_mapping import ClampActions, IdentityActions
from fastlight.models.base import ActionMapping

KINDS = ("discrete", "box", "multidiscrete", "multibinary")


class ActionHead(nn.Module):
    """Actor outputs ``[N, out_dim]`` -> actions, log-probs ``[N]`` and entropies ``[N]``.

    Args:
        kind: one of :data:`KINDS`.
        sizes: ``(N,)`` choices, ``(D,)`` dimensions, the choices of each entry, or ``(K,)`` bits.
        init_log_std: the Gaussian's initial log-std (``box``).
        action_bound: ``box`` actions are clipped to ``[-bound, bound]`` before ``env.step``.
    """

    def __init__(
        self,
        kind: str,
        sizes: tuple[int, ...],
        *,
        init_log_std: float = 0.0,
        action_bound: float | None = 1.0,
    ) -> None:
        super().__init__()
        if kind not in KINDS or not sizes or min(sizes) < 1:
            raise ValueError(f"ActionHead: kind must be one of {' | '.join(KINDS)} with sizes >= 1, got "
                             f"{kind!r} {sizes}")  # fmt: skip
        self.kind, self.sizes, self.action_bound = kind, tuple(int(s) for s in sizes), action_bound
        self.out_dim = sum(self.sizes)
        if kind == "box":
            self.log_std = nn.Parameter(torch.full((self.out_dim,), float(init_log_std)))

    def _dists(self, out: Tensor) -> list[Categorical] | Normal | Bernoulli:
        if self.kind == "box":
            return Normal(out, self.log_std.exp().expand_as(out))
        if self.kind == "multibinary":
            return Bernoulli(logits=out)
        return [Categorical(logits=logits) for logits in out.split(self.sizes, dim=-1)]

    def sample(self, out: Tensor, *, deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """``(actions, log-probs [N])`` drawn from (or the mode of) the distribution at ``out``."""
        dist = self._dists(out)
        if isinstance(dist, Normal):
            actions = dist.mean if deterministic else dist.sample()
        elif isinstance(dist, Bernoulli):
            actions = (out > 0).long() if deterministic else dist.sample().long()
        else:
            parts = [d.probs.argmax(-1) if deterministic else d.sample() for d in dist]
            actions = parts[0] if self.kind == "discrete" else torch.stack(parts, dim=-1)
        return actions, self.log_prob(out, actions, dist)

    def log_prob(self, out: Tensor, actions: Tensor, dist: object = None) -> Tensor:
        """Log-probs ``[N]`` of ``actions`` under the distribution at ``out``."""
        dist = self._dists(out) if dist is None else dist
        if isinstance(dist, Normal):
            return dist.log_prob(actions).sum(-1)
        if isinstance(dist, Bernoulli):
            return dist.log_prob(actions.to(out.dtype)).sum(-1)
        if self.kind == "discrete":
            return dist[0].log_prob(actions.reshape(-1))
        return sum(d.log_prob(actions[..., i]) for i, d in enumerate(dist))

    def entropy(self, out: Tensor) -> Tensor:
        """Entropies ``[N]`` (summed over an action's entries)."""
        dist = self._dists(out)
        if isinstance(dist, Normal | Bernoulli):
            return dist.entropy().sum(-1)
        return sum(d.entropy() for d in dist)

    def action_mapping(self) -> ActionMapping:
        """Gaussian actions are clipped to ``[-action_bound, action_bound]``; the others pass."""
        if self.kind == "box" and self.action_bound is not None:
            return ClampActions(float(self.action_bound))
        return IdentityActions()
