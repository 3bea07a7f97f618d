"""``rollout/*`` metrics of one Rollout: episode returns and lengths, outcomes, policy lag."""

from __future__ import annotations

import torch
from torch import Tensor

from fastlight.rollout import Rollout


def rollout_metrics(rollout: Rollout, *, current_version: int) -> dict[str, Tensor]:
    """Means over the episodes the Rollout delivered, plus the policy lag of its valid steps.

    ``policy_lag`` = current version - behaviour version (AcceRL §staleness); 0 when on-policy.
    Episode metrics are only present when at least one trajectory ended in the Rollout.
    """
    out: dict[str, Tensor] = {}
    eps = rollout.stats.episodes
    if eps:
        out["rollout/return"] = torch.tensor(sum(e.ret for e in eps) / len(eps))
        out["rollout/episode_length"] = torch.tensor(
            sum(e.length for e in eps) / len(eps), dtype=torch.float32
        )
        out["rollout/crash_rate"] = torch.tensor(sum(e.crashed for e in eps) / len(eps))
        out["rollout/success_rate"] = torch.tensor(sum(e.success for e in eps) / len(eps))
        out["rollout/episodes"] = torch.tensor(float(len(eps)))
    valid = rollout.valid
    lag = (current_version - rollout.policy_version)[valid].float()
    if lag.numel():
        out["rollout/policy_lag"] = lag.mean()
        out["rollout/policy_lag_max"] = lag.max()
    out["rollout/valid_steps"] = valid.sum().float()
    out["rollout/dropped_stale"] = torch.tensor(float(rollout.stats.dropped_stale))
    out["rollout/dropped_nonfinite"] = torch.tensor(float(rollout.stats.dropped_nonfinite))
    out["perf/data_wait_ms"] = torch.tensor(1000.0 * rollout.stats.data_wait_s)
    return out
