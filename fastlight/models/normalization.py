"""Observation and return normalisation as part of the policy.

As SB3's ``VecNormalize``, cleanrl's ``NormalizeObservation`` / ``NormalizeReward`` and Sample Factory's
``normalize_input`` / ``normalize_returns``, but the running statistics are *buffers of the policy*
(:class:`NormalizedPolicy`), updated by the trainer from each Rollout's valid steps, so every sampler,
the inference worker, ``fastlight evaluate`` and every checkpoint use the same numbers.

- **Observations**: ``(obs - mean) / sqrt(var + eps)``, clipped to ``[-clip, clip]``, with the
  running moments (float64) of every valid observation seen.
- **Returns**: the critic predicts values in units of the running mean/std of the value targets;
  :class:`NormalizedPolicy` hands out values in return units (``v * std + mean``), and the module
  divides the value error by ``std`` (:attr:`NormalizedPolicy.value_scale`).

Both merge batch moments with Chan et al.'s parallel update; under DDP the batch moments are the
all-reduced ones (``reduce``), so every rank holds the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from fastlight.models.base import ActionMapping, ActOutput, EvalOutput, Obs, PolicyBase

#: ``reduce(sum_tensor) -> sum over ranks`` (identity on one process).
Reduce = Callable[[Tensor], Tensor]


def _no_reduce(x: Tensor) -> Tensor:
    return x


class RunningMeanStd(nn.Module):
    """Running mean and variance of vectors ``[..., D]`` (float64 buffers ``mean``, ``var``, ``count``).

    Args:
        shape: the feature shape ``D`` (``()`` for scalars).
        eps: added to ``var`` under the square root (SB3's 1e-8).
        clip: normalised values are clipped to ``[-clip, clip]`` (SB3's 10); ``None``: no clip.
    """

    def __init__(self, shape: tuple[int, ...] = (), *, eps: float = 1e-8, clip: float | None = 10.0) -> None:
        super().__init__()
        self.shape, self.eps, self.clip = tuple(shape), eps, clip
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(self.shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: Tensor, valid: Tensor | None = None, *, reduce: Reduce = _no_reduce) -> None:
        """Add the rows of ``x`` (``[..., *shape]``) where ``valid`` (``x``'s leading shape) holds; the
        batch's count, sum and squared deviations are summed over ranks with ``reduce`` first."""
        lead = x.shape[: x.dim() - len(self.shape)]
        rows = x.reshape(-1, *self.shape).to(torch.float64)
        if valid is not None:
            if tuple(valid.shape) != tuple(lead):
                raise ValueError(
                    f"RunningMeanStd.update: valid has shape {tuple(valid.shape)}, x leads with {tuple(lead)}"
                )
            rows = rows[valid.reshape(-1).to(torch.bool)]
        n = reduce(torch.tensor(float(rows.shape[0]), dtype=torch.float64, device=rows.device))
        if float(n) == 0:
            return
        mean = reduce(rows.sum(0)) / n
        m2 = reduce((rows - mean).square().sum(0))  # deviations from the *global* batch mean
        self._merge(n, mean, m2 / n)

    def _merge(self, n: Tensor, mean: Tensor, var: Tensor) -> None:
        """Chan et al.'s parallel combination of (count, mean, var) pairs."""
        m, c = self.count, self.count + n
        delta = mean.to(self.mean) - self.mean
        m2 = self.var * m + var.to(self.var) * n + delta.square() * m * n / c
        self.mean.add_(delta * n / c)
        self.var.copy_(m2 / c)
        self.count.copy_(c)

    def normalize(self, x: Tensor) -> Tensor:
        """``(x - mean) / sqrt(var + eps)``, clipped, in ``x``'s floating dtype (float32 for ints)."""
        dtype = x.dtype if x.is_floating_point() else torch.float32
        out = (x.to(torch.float64) - self.mean) / torch.sqrt(self.var + self.eps)
        if self.clip is not None:
            out = out.clamp(-self.clip, self.clip)
        return out.to(dtype)

    @property
    def std(self) -> Tensor:
        return torch.sqrt(self.var + self.eps)


def resolve_normalization(
    *, continuous: bool, obs_dim: int, normalize_obs: bool | None, normalize_returns: bool | None
) -> tuple[bool, bool]:
    """Whether observations and returns are normalised, ``None`` settings resolved: on for continuous
    actions over flat vector observations (``obs_dim`` above 0), off otherwise."""
    auto = bool(continuous) and int(obs_dim or 0) > 0
    return tuple(auto if s is None else bool(s) for s in (normalize_obs, normalize_returns))


class NormalizedPolicy(PolicyBase):
    """``policy`` behind observation and/or return normalisation (see the module docstring).

    Args:
        policy: the actor-critic over normalised observations, whose critic predicts normalised
            values (when ``normalize_returns``).
        obs_shape: the observation's feature shape (a flat vector's ``(obs_dim,)``).
        normalize_obs: keep running observation statistics and normalise with them.
        normalize_returns: keep running value-target statistics; values leave in return units.
        clip_obs: normalised observations are clipped to ``[-clip_obs, clip_obs]``.
    """

    def __init__(
        self,
        policy: PolicyBase,
        *,
        obs_shape: tuple[int, ...],
        normalize_obs: bool = True,
        normalize_returns: bool = True,
        clip_obs: float = 10.0,
    ) -> None:
        super().__init__()
        self.policy = policy
        self.obs_rms = RunningMeanStd(tuple(obs_shape), clip=clip_obs) if normalize_obs else None
        self.ret_rms = RunningMeanStd((), clip=None) if normalize_returns else None

    def _obs(self, obs: Obs) -> Obs:
        if self.obs_rms is None:
            return obs
        if not isinstance(obs, Tensor):
            raise TypeError(
                "NormalizedPolicy normalises tensor observations, got a dict (set normalize_obs false)"
            )
        flat = obs.reshape(obs.shape[0], *self.obs_rms.shape)
        return self.obs_rms.normalize(flat).reshape(obs.shape)

    def _values(self, v: Tensor) -> Tensor:
        r = self.ret_rms
        return v if r is None else (v.to(torch.float64) * r.std + r.mean).to(v.dtype)

    @property
    def value_scale(self) -> Tensor:
        """The std the value error is divided by in the loss (1 without return normalisation)."""
        return self.ret_rms.std.float() if self.ret_rms is not None else torch.ones(())

    def act(self, obs: Obs, *, step: Tensor | None = None, deterministic: bool = False) -> ActOutput:
        out = self.policy.act(self._obs(obs), step=step, deterministic=deterministic)
        return ActOutput(out.actions, out.logprobs, self._values(out.values))

    def evaluate(self, obs: Obs, actions: Tensor, *, step: Tensor | None = None) -> EvalOutput:
        out = self.policy.evaluate(self._obs(obs), actions, step=step)
        return EvalOutput(out.logprobs, out.entropy, self._values(out.values))

    def value(self, obs: Obs, *, step: Tensor | None = None) -> Tensor:
        return self._values(self.policy.value(self._obs(obs), step=step))

    def action_mapping(self) -> ActionMapping:
        return self.policy.action_mapping()

    def update_obs(self, obs: Obs, valid: Tensor, *, reduce: Reduce = _no_reduce) -> None:
        """Add a Rollout's valid observations (``obs [T, E, ...]``, ``valid [T, E]``)."""
        if self.obs_rms is not None and isinstance(obs, Tensor):
            self.obs_rms.update(obs.reshape(*valid.shape, *self.obs_rms.shape), valid, reduce=reduce)

    def update_returns(self, returns: Tensor, valid: Tensor, *, reduce: Reduce = _no_reduce) -> None:
        """Add a Rollout's valid value targets (``returns``, ``valid`` of one shape)."""
        if self.ret_rms is not None:
            self.ret_rms.update(returns, valid, reduce=reduce)


def with_normalization(
    policy: PolicyBase, *, obs_dim: int, normalize_obs: bool, normalize_returns: bool
) -> PolicyBase:
    """``policy`` behind a :class:`NormalizedPolicy` over flat ``obs_dim`` observations where either
    statistic is on and it has none yet; ``policy`` itself otherwise."""
    if not (normalize_obs or normalize_returns) or isinstance(policy, NormalizedPolicy):
        return policy
    return NormalizedPolicy(
        policy, obs_shape=(obs_dim,), normalize_obs=normalize_obs, normalize_returns=normalize_returns
    )
