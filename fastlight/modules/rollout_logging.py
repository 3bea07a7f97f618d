"""``rollout/*`` metrics of one Rollout: episode returns and lengths, outcomes, policy lag."""

from __future__ import annotations

import torch
from torch import Tensor

from fastlight.rollout import Rollout


def rollout_metrics(rollout: Rollout, *, current_version: int) -> dict[str, Tensor]:
    """Means over the episodes the Rollout delivered, plus the policy lag of its valid steps.

    ``rollout/return``, ``rollout/episode_length``, ``rollout/crash_rate`` and ``rollout/success_rate``
    average the *completed* episodes only (as Stable-Baselines3's ``ep_rew_mean`` does); episodes cut by
    a DPSA/SGR unified truncation are reported apart as ``rollout/return_cut`` and ``rollout/episodes_cut``.
    An env that does not report success (crashes) counts as 0. ``policy_lag`` = current version -
    behaviour version (AcceRL §staleness). ``rollout/valid_steps`` counts env steps; with action chunks
    the transitions are ``rollout/policy_steps``. ``perf/termination_threshold`` is the mean DPSA
    threshold of the Rollout's cycles.
    """
    out: dict[str, Tensor] = {}
    done = [e for e in rollout.stats.episodes if not e.cut]
    cut = [e for e in rollout.stats.episodes if e.cut]
    if done:
        n = len(done)
        out["rollout/return"] = torch.tensor(sum(e.ret for e in done) / n)
        out["rollout/episode_length"] = torch.tensor(sum(e.length for e in done) / n, dtype=torch.float32)
        out["rollout/crash_rate"] = torch.tensor(sum(e.crashed is True for e in done) / n)
        out["rollout/success_rate"] = torch.tensor(sum(e.success is True for e in done) / n)
    out["rollout/episodes"] = torch.tensor(float(len(done)))
    out["rollout/episodes_cut"] = torch.tensor(float(len(cut)))
    if cut:
        out["rollout/return_cut"] = torch.tensor(sum(e.ret for e in cut) / len(cut))
    valid = rollout.valid
    lag = (current_version - rollout.policy_version)[valid].float()
    if lag.numel():
        out["rollout/policy_lag"] = lag.mean()
        out["rollout/policy_lag_max"] = lag.max()
    if rollout.env_steps is None:
        out["rollout/valid_steps"] = valid.sum().float()
    else:  # action chunks: env steps, and the transitions (policy steps) apart
        out["rollout/valid_steps"] = rollout.env_steps.sum().float()
        out["rollout/policy_steps"] = valid.sum().float()
    out["rollout/dropped_stale"] = torch.tensor(float(rollout.stats.dropped_stale))
    out["rollout/dropped_nonfinite"] = torch.tensor(float(rollout.stats.dropped_nonfinite))
    out["rollout/cut_in_flight"] = torch.tensor(float(rollout.stats.cut_in_flight))
    out["perf/data_wait_ms"] = torch.tensor(1000.0 * rollout.stats.data_wait_s)
    stats = rollout.stats
    if stats.threshold_sum > 0 and stats.global_resets:  # dpsa: the (mean) threshold its cycles used
        out["perf/termination_threshold"] = torch.tensor(stats.threshold_sum / stats.global_resets)
    return out
