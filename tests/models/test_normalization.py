"""Running observation / return statistics: against a naive mean/var over every valid row seen,
padding-invariant, exact across simulated DDP ranks, and the policy wrapper's units."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from fastlight.models.mlp import MLPActorCritic
from fastlight.models.normalization import NormalizedPolicy, RunningMeanStd


def batches(seed: int, n: int = 5):
    g = torch.Generator().manual_seed(seed)
    for i in range(n):
        t, e = 3 + i, 4
        x = torch.randn(t, e, 3, generator=g) * torch.tensor([1.0, 10.0, 0.1]) + torch.tensor(
            [5.0, -2.0, 0.0]
        )
        valid = torch.rand(t, e, generator=g) > 0.3
        yield x, valid


def test_matches_a_naive_mean_and_var_over_all_valid_rows():
    rms = RunningMeanStd((3,))
    seen = []
    for x, valid in batches(0):
        rms.update(x, valid)
        seen.append(x[valid].double().numpy())
    rows = np.concatenate(seen)
    # float64 throughout: agreement to ~1e-12 relative; a wrong merge is off by O(1).
    np.testing.assert_allclose(rms.mean.numpy(), rows.mean(0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(rms.var.numpy(), rows.var(0), rtol=1e-10, atol=1e-12)
    assert float(rms.count) == len(rows)


def test_padding_never_enters_the_statistics():
    a, b = RunningMeanStd((3,)), RunningMeanStd((3,))
    for x, valid in batches(1):
        a.update(x, valid)
        junk = x.clone()
        junk[~valid] = 1e6  # whatever a dummy step holds
        b.update(junk, valid)
    torch.testing.assert_close(a.mean, b.mean, rtol=0, atol=0)
    torch.testing.assert_close(a.var, b.var, rtol=0, atol=0)


def test_two_ranks_reduced_equal_one_process_over_both():
    """Rank r holds half of every batch; ``reduce`` sums over both, as an all-reduce would (two
    threads meeting at a barrier for every reduced statistic)."""
    one, ranks = RunningMeanStd((3,)), [RunningMeanStd((3,)), RunningMeanStd((3,))]
    data = list(batches(2))
    slots: list[list] = [[], []]
    barrier = threading.Barrier(2)

    def reduce(t, r):
        slots[r].append(t)
        barrier.wait()
        total = slots[0][-1] + slots[1][-1]
        barrier.wait()
        return total

    def rank(r):
        for x, valid in data:
            cols = slice(0, 2) if r == 0 else slice(2, 4)
            ranks[r].update(x[:, cols], valid[:, cols], reduce=lambda t: reduce(t, r))

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for x, valid in data:
        one.update(x, valid)
    for rms in ranks:
        torch.testing.assert_close(rms.mean, one.mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(rms.var, one.var, rtol=1e-12, atol=1e-12)
        assert float(rms.count) == float(one.count)


def test_normalize_clips_and_keeps_float32():
    rms = RunningMeanStd((2,), clip=5.0)
    rms.update(torch.tensor([[0.0, 0.0], [2.0, 2.0]]))
    out = rms.normalize(torch.tensor([[1.0, 1000.0]]))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[0.0, 5.0]]), rtol=0, atol=1e-6)


def test_policy_wrapper_values_are_in_return_units_and_obs_normalised():
    torch.manual_seed(0)
    inner = MLPActorCritic(3, 2, continuous=True)
    pol = NormalizedPolicy(inner, obs_shape=(3,))
    obs = torch.randn(8, 3) * 50 + 7
    pol.update_obs(obs.reshape(2, 4, 3), torch.ones(2, 4, dtype=torch.bool))
    returns = torch.randn(2, 4) * 100 + 30
    pol.update_returns(returns, torch.ones(2, 4, dtype=torch.bool))
    std, mean = pol.ret_rms.std, pol.ret_rms.mean
    # value(): the inner critic on normalised obs, then * std + mean (float32 rounding of the inputs).
    expect = inner.value(pol.obs_rms.normalize(obs)).double() * std + mean
    torch.testing.assert_close(pol.value(obs).double(), expect, rtol=1e-5, atol=1e-4)
    out = pol.act(obs, deterministic=True)
    ev = pol.evaluate(obs, out.actions)
    torch.testing.assert_close(ev.logprobs, out.logprobs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ev.values, out.values, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(pol.value_scale, std.float(), rtol=0, atol=0)
    # The statistics are buffers: they travel with state_dict (weights publication, checkpoints).
    keys = set(pol.state_dict())
    assert {"obs_rms.mean", "obs_rms.var", "obs_rms.count", "ret_rms.mean", "ret_rms.var"} <= keys


def test_valid_shape_mismatch_is_named():
    with pytest.raises(ValueError, match=r"valid has shape \(2,\), x leads with \(3,\)"):
        RunningMeanStd((2,)).update(torch.zeros(3, 2), torch.ones(2, dtype=torch.bool))
