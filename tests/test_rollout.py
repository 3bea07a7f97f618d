"""The Rollout contract: validation names the broken field, padding and joining keep the invariant."""

from __future__ import annotations

import pytest
import torch

from fastlight.rollout import Rollout


def make(t_len: int = 3, n_env: int = 2, *, done_last: bool = True) -> Rollout:
    z = torch.zeros(t_len, n_env)
    truncated = torch.zeros(t_len, n_env, dtype=torch.bool)
    truncated[-1] = done_last
    return Rollout(
        obs=torch.randn(t_len, n_env, 4),
        actions=z.long(),
        logprobs=z.clone(),
        values=z.clone(),
        rewards=torch.ones(t_len, n_env),
        terminated=torch.zeros_like(truncated),
        truncated=truncated,
        valid=torch.ones(t_len, n_env, dtype=torch.bool),
        step=z.long(),
        task_id=z.long(),
        policy_version=z.long(),
        bootstrap_values=z.clone(),
    )


def test_validate_names_the_bad_field():
    r = make()
    r.rewards = torch.zeros(3, 5)
    with pytest.raises(ValueError, match=r"Rollout.rewards leading shape \(3, 5\) != valid shape \(3, 2\)"):
        r.validate()
    with pytest.raises(ValueError, match="last valid step of every env must be terminated or truncated"):
        make(done_last=False).validate()
    bad = make()
    bad.valid[1, 0] = False  # padding inside an episode
    with pytest.raises(ValueError, match="padding found inside an episode"):
        bad.validate()


def test_cat_pads_shorter_rollouts_with_invalid_steps():
    a, b = make(3, 2), make(5, 1)
    c = Rollout.cat([a, b]).validate()
    assert c.shape == (5, 3)
    assert c.valid[:, :2].sum() == 6 and not c.valid[3:, :2].any() and c.valid[:, 2].all()
    assert torch.equal(c.obs[:3, :2], a.obs) and torch.equal(c.obs[3:, :2], torch.zeros(2, 2, 4))


def test_cat_along_time_joins_cycles_and_merges_stats():
    a, b = make(3, 2), make(2, 2)
    a.stats.valid_steps, b.stats.valid_steps = 6, 4
    c = Rollout.cat([a, b], dim=0).validate()
    assert c.shape == (5, 2) and c.stats.valid_steps == 10
    with pytest.raises(ValueError, match=r"same E in every rollout, got \[1, 2\]"):
        Rollout.cat([make(2, 2), make(2, 1)], dim=0)
