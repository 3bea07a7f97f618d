"""Flow-SDE: a flow-matching denoising chain as a Gaussian policy (πRL, arXiv 2510.25889, flow-SDE).

pi0's action expert predicts a velocity ``v(x_t, t)`` for ``x_t = t eps + (1 - t) a`` (``t = 1``: noise,
``t = 0``: the action chunk; ``v = eps - a``), and its sampler runs ``K`` Euler steps
``x_{k+1} = x_k - delta v(x_k, t_k)`` with ``t_k = 1 - k delta``, ``delta = 1 / K``. πRL's flow-SDE makes a
step a Gaussian transition with the ODE's marginals (the reverse SDE of the linear interpolant, as
Flow-GRPO writes it; ``x + (1 - t) v`` is the model's estimate of ``eps`` and ``-(x + (1 - t) v) / t``
its score)::

    x_{k+1} ~ N(mu_k, std_k^2),  mu_k = x_k - delta [v + sigma_k^2 / (2 t_k) (x_k + (1 - t_k) v)],
    std_k = sigma_k sqrt(delta),  sigma_k = noise_level sqrt(t_k / (1 - t_k))

(``1 - t_0 = 0``: step 0 uses ``1 - t_1`` there, as πRL does). The log-likelihood of a chain is the
sum of ``log N(x_{k+1}; mu_k, std_k^2)`` over its stochastic steps, element-wise; the noise does not
depend on the weights, so ``std_k`` and the entropy are constants of the step.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def sde_times(num_steps: int, device: torch.device | None = None) -> Tensor:
    """``t_k = 1 - k / K`` for ``k = 0..K``: ``[K + 1]`` float32 (the one table act and evaluate index,
    so both feed the expert the same time values)."""
    return 1.0 - torch.arange(num_steps + 1, dtype=torch.float32, device=device) / num_steps


def sde_transition(x: Tensor, v: Tensor, k: Tensor, num_steps: int, noise: float) -> tuple[Tensor, Tensor]:
    """Mean and std of step ``k`` of the flow-SDE with noise level ``noise`` (``a`` above).

    Shapes: ``x``, ``v`` ``[N, C, M]`` float32 (state and velocity at ``t_k``), ``k`` ``[N]`` long in
    ``[0, K)``; returns ``mean [N, C, M]`` and ``std [N, 1, 1]``.
    """
    t_all = sde_times(num_steps, x.device)
    t = t_all[k][:, None, None]
    one_minus = 1.0 - torch.where(k == 0, t_all[1], t_all[k])[:, None, None]
    sigma2 = noise**2 * t / one_minus
    delta = 1.0 / num_steps
    mean = x - delta * (v + sigma2 / (2 * t) * (x + (1 - t) * v))
    return mean, (sigma2 * delta).sqrt()


def gaussian_logprob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Element-wise ``log N(x; mean, std^2)``; ``std`` broadcasts against ``x``."""
    return -0.5 * ((x - mean) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)


def gaussian_entropy(std: Tensor) -> Tensor:
    """Element-wise entropy ``0.5 log(2 pi e std^2)`` of ``N(., std^2)``."""
    return 0.5 * math.log(2 * math.pi * math.e) + std.log()
