"""Advantage estimation over padded rollouts: masked GAE (FAST §DPSA/SMPO) and AcceRL's global
advantage normalisation (one all-reduce of sum, sum of squares and count).

Masked GAE, per env column, over a time-major ``[T, E]`` rollout:

    next_v_t = bootstrap_values[t]   if truncated[t]   (unified truncation / time limit)
               0                     if terminated[t]  (the MDP ended: no bootstrap)
               V[t+1]                otherwise
    δ_t = r_t + γ·next_v_t - V_t
    A_t = δ_t + γλ·(1 - done_t)·A_{t+1}         done = terminated | truncated
    R_t = A_t + V_t

and ``A_t = R_t = 0`` where ``valid[t]`` is False. The :class:`~fastlight.rollout.Rollout`
invariant (a valid step that is not done is followed by a valid step) guarantees that padding
never feeds the recursion; :func:`masked_gae` checks it, because otherwise a DPSA dummy step
would silently leak into the advantage of a real one.

**Action chunks** (a transition executes ``h_t`` env steps, see :mod:`fastlight.rollout`): each
transition is one step of a semi-MDP. :func:`chunk_rewards` turns its raw env-step rewards into
``r_t = Σ_{i<h_t} γ^i r_{t,i}`` and its discount into ``γ_t = γ^{h_t}``, and :func:`masked_gae`
runs the same recursion with ``γ_t`` in place of ``γ``::

    δ_t = r_t + γ_t·next_v_t - V_t
    A_t = δ_t + γ_t·λ·(1 - done_t)·A_{t+1}

so a chunk's one-step target ``r_t + γ^{h_t} V(s_{t+h_t})`` is the ``h_t``-step return of the env
steps it ran, and with ``λ = 1`` the returns are the discounted Monte-Carlo returns over env steps.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from fastlight.losses.masked import check_mask, zero_invalid

__all__ = [
    "chunk_rewards",
    "global_advantage_moments",
    "group_relative_advantages",
    "group_step_advantages",
    "masked_gae",
    "normalize_advantages",
]


def _check_gae_inputs(tensors: dict[str, Tensor], gamma: float, lam: float) -> None:
    shape = tuple(tensors["valid"].shape)
    if len(shape) != 2:
        raise ValueError(f"masked_gae: valid must be [T, E], got shape {shape}")
    for name, t in tensors.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"masked_gae: {name} shape {tuple(t.shape)} != valid shape {shape}")
    for name in ("terminated", "truncated", "valid"):
        if tensors[name].dtype != torch.bool:
            raise ValueError(f"masked_gae: {name} must be bool, got dtype {tensors[name].dtype}")
    for name, value in (("gamma", gamma), ("lam", lam)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"masked_gae: {name} must be in [0, 1], got {value}")


def _check_episode_structure(terminated: Tensor, truncated: Tensor, valid: Tensor) -> None:
    # Flags in padded slots are garbage by contract, so only valid steps are checked.
    if bool((valid & terminated & truncated).any()):
        raise ValueError("masked_gae: a valid step cannot be both terminated and truncated")
    done = terminated | truncated
    next_valid = torch.cat([valid[1:], torch.zeros_like(valid[:1])], dim=0)
    if bool((valid & ~done & ~next_valid).any()):
        raise ValueError(
            "masked_gae: a valid step that is neither terminated nor truncated must be followed by "
            "a valid step (padding inside an episode, or an episode still running at t = T-1)"
        )


def chunk_rewards(step_rewards: Tensor, env_steps: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
    """Action-chunk transitions as semi-MDP steps: ``(Σ_{i<h} γ^i r_i, γ^h)`` per transition.

    Shapes: ``step_rewards [T, E, H]`` (the raw reward of each env step of the chunk), ``env_steps
    [T, E]`` integer (``h``, the steps executed; entries at ``i >= h`` are ignored, whatever they
    hold). Returns ``(rewards [T, E], discounts [T, E])`` in ``step_rewards``' dtype; padding (``h =
    0``) gets reward 0 and discount 1.
    """
    if step_rewards.dim() != 3 or tuple(env_steps.shape) != tuple(step_rewards.shape[:2]):
        raise ValueError(
            f"chunk_rewards: step_rewards must be [T, E, H] and env_steps [T, E], got "
            f"{tuple(step_rewards.shape)} and {tuple(env_steps.shape)}"
        )
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"chunk_rewards: gamma must be in [0, 1], got {gamma}")
    i = torch.arange(step_rewards.shape[2], device=step_rewards.device)
    # Powers in float64 (gamma^i, then cast), as the env-step recursion would accumulate them.
    powers = torch.tensor(gamma, dtype=torch.float64, device=step_rewards.device) ** i
    executed = i < env_steps.unsqueeze(-1)
    weighted = torch.where(executed, step_rewards * powers.to(step_rewards.dtype), step_rewards.new_zeros(()))
    discounts = torch.tensor(gamma, dtype=torch.float64, device=env_steps.device) ** env_steps.double()
    return weighted.sum(-1), discounts.to(step_rewards.dtype)


def masked_gae(
    *,
    rewards: Tensor,
    values: Tensor,
    bootstrap_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    valid: Tensor,
    gamma: float = 0.99,
    lam: float = 0.95,
    discounts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE(γ, λ) over a padded ``[T, E]`` rollout (the module docstring's recursion); ``discounts
    [T, E]`` (action chunks: ``γ^{h_t}`` from :func:`chunk_rewards`) replaces ``gamma`` per transition.

    Shapes: every input ``[T, E]``; ``terminated``, ``truncated``, ``valid`` bool. Returns
    ``(advantages, returns)``, both ``[T, E]`` and exactly 0 where ``valid`` is False, whatever (NaN,
    inf) the padded slots of ``rewards``/``values``/``bootstrap_values`` hold (every read of one goes
    through ``torch.where``). Raises ``ValueError`` on a shape/dtype mismatch or a broken episode.
    """
    fields = dict(
        rewards=rewards,
        values=values,
        bootstrap_values=bootstrap_values,
        terminated=terminated,
        truncated=truncated,
        valid=valid,
    )
    if discounts is not None:
        fields["discounts"] = discounts
    _check_gae_inputs(fields, gamma, lam)
    _check_episode_structure(terminated, truncated, valid)
    done = terminated | truncated
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    adv_next = torch.zeros_like(values[0])
    steps: list[Tensor] = []
    for t in reversed(range(values.shape[0])):
        # At t = T-1 a valid step is always done (checked above), so this 0 is never selected.
        v_next = values[t + 1] if t + 1 < values.shape[0] else torch.zeros_like(values[t])
        next_v = torch.where(truncated[t], bootstrap_values[t], torch.where(terminated[t], zero, v_next))
        g = gamma if discounts is None else discounts[t]
        delta = rewards[t] + g * next_v - values[t]
        carry = torch.where(done[t], zero, adv_next)
        adv_next = torch.where(valid[t], delta + g * lam * carry, zero)
        steps.append(adv_next)
    advantages = torch.stack(steps[::-1], dim=0)
    returns = torch.where(valid, advantages + values, zero)
    return advantages, returns


def global_advantage_moments(
    advantages: Tensor, valid: Tensor, *, group: dist.ProcessGroup | None = None
) -> tuple[Tensor, Tensor]:
    """Mean and std of the valid advantages over *all* ranks (AcceRL §global normalisation).

    One ``all_reduce`` (SUM) of ``[Σ valid·A, Σ valid·A², Σ valid]`` when ``torch.distributed`` has
    world size > 1 (in ``group``); then ``mean = s/n``, ``std = √max(s2/n - mean², 1e-12)`` (``n``
    floored at 1), summed in float64 (``s2/n - mean²`` cancels in float32), cast back. Detached.

    Shapes: ``advantages [*B, *R]`` (e.g. ``[T, E]``), ``valid [*B]`` bool; returns two ``[]``.
    """
    check_mask(advantages, valid, x_name="advantages", mask_name="valid")
    adv = zero_invalid(advantages.detach(), valid).double()
    per_entry = adv.numel() // max(valid.numel(), 1)
    stats = torch.stack([adv.sum(), adv.square().sum(), valid.sum().double() * per_entry])
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
    total, total_sq, count = stats.unbind()
    count = count.clamp_min(1.0)
    mean = total / count
    var = (total_sq / count - mean.square()).clamp_min(1e-12)
    return mean.to(advantages.dtype), var.sqrt().to(advantages.dtype)


def normalize_advantages(
    advantages: Tensor, valid: Tensor, *, group: dist.ProcessGroup | None = None, eps: float = 1e-8
) -> Tensor:
    """``(A - mean) / (std + eps)`` with the global moments of :func:`global_advantage_moments`.

    Shapes: ``advantages [*B, *R]``, ``valid [*B]`` bool; returns ``advantages``' shape, exactly 0
    on padding (so a padded slot never looks like a below-average step).
    """
    mean, std = global_advantage_moments(advantages, valid, group=group)
    return zero_invalid((zero_invalid(advantages, valid) - mean) / (std + eps), valid)


def group_relative_advantages(
    *,
    rewards: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    valid: Tensor,
    group_size: int,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO's advantages (Shao et al., 2024, §4.1.2 outcome supervision; SimpleVLA-RL and RLinf's VLA RL):
    each clip's return (its valid rewards, undiscounted) minus the mean over its group, over the
    group's standard deviation, on every valid step of the clip, scaled by ``mean clip length / its
    length``: GRPO's objective averages over each output's tokens, then over the outputs, which the
    SMPO mean over all valid steps (FAST §SMPO) equals with this scale.

    Shapes: ``[T, E]`` each. A column holds one clip per sampling cycle (each ends with a done step,
    as ``Rollout.validate`` asks), and a group is ``group_size`` consecutive columns whose clips of one
    cycle started from the same seed (``--data.group_size``). A group whose clips all earned the same
    return gets 0: it says nothing about which actions were better. Returns ``[T, E]``, 0 where invalid.
    """
    _check_episode_structure(terminated, truncated, valid)
    n_env = rewards.shape[1]
    if group_size < 1 or n_env % group_size:
        raise ValueError(f"group_size {group_size} must be >= 1 and divide the rollout's {n_env} columns")
    done = ((terminated | truncated) & valid).long()
    clip = torch.cumsum(done, 0) - done  # [T, E]: which clip of its column each step belongs to
    clips = done.sum(0).view(-1, group_size)  # [E / G, G]
    if bool((clips != clips[:, :1]).any()):
        raise ValueError(f"the columns of a group hold different numbers of clips: {done.sum(0).tolist()}")
    n_clip = max(int(clips.max()), 1)
    clip = clip.clamp(max=n_clip - 1)
    returns = torch.zeros(n_clip, n_env, dtype=rewards.dtype, device=rewards.device)
    returns.scatter_add_(0, clip, zero_invalid(rewards, valid))
    lengths = torch.zeros(n_clip, n_env, dtype=rewards.dtype, device=rewards.device)
    lengths.scatter_add_(0, clip, valid.to(rewards.dtype))
    g = returns.view(n_clip, -1, group_size)
    z = ((g - g.mean(-1, keepdim=True)) / (g.std(-1, unbiased=False, keepdim=True) + eps)).view(n_clip, n_env)
    scale = lengths[lengths > 0].mean() / lengths.clamp(min=1)
    return zero_invalid((z * scale).gather(0, clip), valid)


def group_step_advantages(
    *, rewards: Tensor, terminated: Tensor, truncated: Tensor, valid: Tensor, group_size: int, gamma: float
) -> Tensor:
    """Per-step group advantages: each step's discounted reward-to-go within its clip minus the mean
    of the other clips of its group at the same step of theirs (RLOO's leave-one-out baseline, Kool et
    al., 2019, taken per step as GiGPO's step-level groups, Feng et al., 2025, §3.2).

    The clips of a group (``group_size`` consecutive columns, ``--data.group_size``) start from one seed
    at the same rows (cycle-based resets), so the others' mean reward-to-go at step ``t`` is a
    state-value baseline that needs no critic; a step with no other valid clip there gets 0. Shapes:
    ``[T, E]`` each; returns ``[T, E]``, 0 where invalid.
    """
    _check_episode_structure(terminated, truncated, valid)
    n_t, n_env = rewards.shape
    if group_size < 2 or n_env % group_size:
        raise ValueError(f"group_size {group_size} must be >= 2 and divide the rollout's {n_env} columns")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"group_step_advantages: gamma must be in [0, 1], got {gamma}")
    done = (terminated | truncated) & valid
    r = zero_invalid(rewards, valid)
    togo = torch.zeros_like(r)
    nxt = torch.zeros_like(r[0])
    for t in range(n_t - 1, -1, -1):  # a done step starts a new sum: nothing leaks across clips
        nxt = r[t] + gamma * nxt * (~done[t]).to(r.dtype)
        togo[t] = nxt
    # The step of its clip each row holds (counted over valid rows), to check the group's alignment.
    pos = torch.cumsum(valid.long(), 0)
    start = torch.cummax(torch.where(done, pos, torch.zeros_like(pos)), 0).values
    pos = (pos - torch.cat([torch.zeros_like(start[:1]), start[:-1]])).view(n_t, -1, group_size)
    m = valid.view(n_t, -1, group_size)
    ref = pos.masked_fill(~m, -1).amax(-1, keepdim=True)
    if bool(((pos != ref) & m).any()):
        raise ValueError(
            "group_step_advantages compares the clips of a group step by step: they must start at the "
            "same rows (a cycle-based --data.reset_mode, with --data.group_size)"
        )
    g, w = togo.view(n_t, -1, group_size), m.to(r.dtype)
    others = w.sum(-1, keepdim=True) - w
    baseline = ((g * w).sum(-1, keepdim=True) - g * w) / others.clamp(min=1)
    adv = torch.where(others > 0, g - baseline, torch.zeros_like(g)).view(n_t, n_env)
    return zero_invalid(adv, valid)
