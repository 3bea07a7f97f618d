"""DPSA / SGR / autoreset stepping against a naive reference and exact expectations."""

from __future__ import annotations

import random
from typing import get_args

import pytest
import torch

from fastlight.sampling.collector import Collector
from fastlight.sampling.collector_settings import RATE_MODES, RESET_MODES, ResetMode
from tests.fake_envs import FixedLengthEnv


def naive_dpsa_masks(lengths: list[int], threshold: float, max_horizon: int) -> tuple[list, list, list]:
    """Reference: step t by t, env by env, with plain Python lists (one cycle)."""
    n = len(lengths)
    valid, term, trunc = [], [], []
    ended = [False] * n
    t = 0
    while True:
        v_row, te_row, tr_row = [], [], []
        for e in range(n):
            v_row.append(not ended[e])
            te_row.append(not ended[e] and t + 1 == lengths[e])
            tr_row.append(False)
        for e in range(n):
            if te_row[e]:
                ended[e] = True
        t += 1
        stop = sum(ended) / n >= threshold or t >= max_horizon
        if stop:
            for e in range(n):
                if v_row[e] and not te_row[e]:
                    tr_row[e] = True
        valid.append(v_row)
        term.append(te_row)
        trunc.append(tr_row)
        if stop:
            return valid, term, trunc


def make_envs(lengths: list[int]) -> list[FixedLengthEnv]:
    return [FixedLengthEnv(lengths=(n,), tag=i) for i, n in enumerate(lengths)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("threshold", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_dpsa_masks_match_naive_loop(seed, threshold, obs_value_policy):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 12) for _ in range(rng.randint(1, 7))]
    c = Collector(make_envs(lengths), mode="dpsa", termination_threshold=threshold, max_horizon=9)
    r = c.collect(obs_value_policy).validate()
    valid, term, trunc = naive_dpsa_masks(lengths, threshold, 9)
    assert r.valid.tolist() == valid
    assert r.terminated.tolist() == term
    assert r.truncated.tolist() == trunc


def test_dummy_steps_never_call_env_step(obs_value_policy):
    envs = make_envs([2, 3, 7, 9])
    r = Collector(envs, mode="dpsa", termination_threshold=1.0, max_horizon=50).collect(obs_value_policy)
    assert r.shape == (9, 4)
    # One env.step per valid slot, none for dummy slots.
    assert [e.step_calls for e in envs] == r.valid.sum(0).tolist() == [2, 3, 7, 9]
    # Dummy steps: obs frozen at the final observation, reward 0, zero actions/values.
    dummy = ~r.valid
    assert torch.equal(r.rewards[dummy], torch.zeros(int(dummy.sum())))
    assert torch.equal(r.values[dummy], torch.zeros(int(dummy.sum())))
    for e, n in enumerate([2, 3, 7, 9]):
        for t in range(n, 9):
            assert r.obs[t, e].tolist() == [float(e), float(n), 1.0]  # final obs, frozen
    assert r.stats.raw_steps == 36 and r.stats.valid_steps == 21


def test_truncation_exactly_at_threshold(obs_value_policy):
    lengths = [2, 3, 5, 9]
    for threshold, horizon in [(0.25, 2), (0.5, 3), (0.75, 5), (1.0, 9), (0.51, 5)]:
        r = Collector(make_envs(lengths), mode="dpsa", termination_threshold=threshold).collect(
            obs_value_policy
        )
        assert r.shape[0] == horizon, threshold
        last = r.shape[0] - 1
        # Still-running envs are truncated on the last row, the ended ones are not.
        assert r.truncated[last].tolist() == [n > horizon for n in lengths]
        assert not r.truncated[:last].any()
        assert r.stats.global_resets == 1


def test_max_horizon_truncation_bootstraps(obs_value_policy):
    envs = make_envs([10, 10, 3])
    r = Collector(envs, mode="dpsa", termination_threshold=1.0, max_horizon=4).collect(obs_value_policy)
    assert r.shape == (4, 3)
    assert r.truncated[3].tolist() == [True, True, False]
    assert r.terminated[2].tolist() == [False, False, True]
    # V(s_{t+1}) of ObsValuePolicy = 10*tag + step, and s_4 has step 4.
    assert r.bootstrap_values[3].tolist() == [4.0, 14.0, 0.0]
    assert r.bootstrap_values[:3].abs().sum() == 0
    cut = [ep for ep in r.stats.episodes if ep.truncated]
    assert sorted(ep.length for ep in cut) == [4, 4]


def test_env_time_limit_is_truncated_not_terminated(obs_value_policy):
    envs = [FixedLengthEnv(lengths=(3,), tag=1, truncate=True), FixedLengthEnv(lengths=(5,), tag=2)]
    r = Collector(envs, mode="dpsa", termination_threshold=1.0).collect(obs_value_policy)
    assert r.truncated[2, 0] and not r.terminated[2, 0]
    assert r.bootstrap_values[2, 0] == 13.0  # V of the final obs (tag 1, step 3)
    assert r.terminated[4, 1] and r.bootstrap_values[4, 1] == 0


@pytest.mark.parametrize("seed", range(3))
def test_sgr_equals_dpsa_with_threshold_one_over_e(seed, obs_value_policy):
    rng = random.Random(seed)
    lengths = [tuple(rng.randint(1, 15) for _ in range(5)) for _ in range(6)]
    a = Collector([FixedLengthEnv(lengths=n, tag=i) for i, n in enumerate(lengths)], mode="sgr")
    b = Collector(
        [FixedLengthEnv(lengths=n, tag=i) for i, n in enumerate(lengths)],
        mode="dpsa",
        termination_threshold=1 / 6,
    )
    for _ in range(4):
        ra, rb = a.collect(obs_value_policy), b.collect(obs_value_policy)
        for name in ("obs", "valid", "terminated", "truncated", "rewards", "bootstrap_values", "step"):
            assert torch.equal(getattr(ra, name), getattr(rb, name)), name
        assert ra.valid.all()  # SGR never emits dummy steps


def test_autoreset_resets_each_env_alone(obs_value_policy):
    envs = make_envs([2, 5])
    c = Collector(envs, mode="autoreset", rollout_steps=6)
    r = c.collect(obs_value_policy).validate()
    assert r.shape == (6, 2) and r.valid.all()
    assert r.terminated[:, 0].tolist() == [False, True, False, True, False, True]
    assert r.terminated[:, 1].tolist() == [False, False, False, False, True, False]
    # Rollout boundary: env 1 is mid-episode, so it is truncated and bootstrapped ...
    assert r.truncated[5].tolist() == [False, True]
    assert r.bootstrap_values[5, 1] == 10 + 1
    # ... and its episode carries over into the next call (no reset in between).
    assert envs[1].reset_calls == 2
    r2 = c.collect(obs_value_policy)
    assert r2.step[0, 1] == 1  # step 1 of the episode that began at t=5
    assert [e.length for e in r.stats.episodes] == [2, 2, 5, 2]


def test_sequential_requires_one_env():
    with pytest.raises(ValueError, match="num_envs must be 1"):
        Collector(make_envs([2, 3]), mode="sequential")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mode": "bogus"}, "reset_mode must be one of dpsa | sgr | autoreset | sequential"),
        ({"termination_threshold": 1.5}, r"termination_threshold must be in \[0, 1\] or auto, got 1.5"),
        ({"max_horizon": 0}, "max_horizon must be >= 1"),
    ],
)
def test_bad_settings_name_the_flag(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Collector(make_envs([2]), **kwargs)


def test_every_reset_mode_the_cli_takes_has_its_traits():
    assert tuple(RESET_MODES) == get_args(ResetMode)
    assert RATE_MODES == "dpsa or sgr"


def test_collector_on_highway_validates():
    import gymnasium as gym
    import highway_env  # noqa: F401

    from fastlight.models.mlp import MLPActorCritic

    envs = [gym.make("highway-fast-v0") for _ in range(3)]
    r = Collector(envs, mode="dpsa", termination_threshold=0.5, max_horizon=8).collect(MLPActorCritic(25, 5))
    r.validate()
    assert r.shape[1] == 3 and 1 <= r.shape[0] <= 8
    assert r.stats.step_time > 0 and r.stats.wall_time >= r.stats.step_time + 0.0


class _Clock:
    """The collector's ``time`` module with a fake ``perf_counter`` that only env resets advance:
    the measured reset costs are the envs' ``reset_s`` exactly, whatever else the machine runs."""

    def __init__(self) -> None:
        import threading
        import time

        self._real, self._lock, self.now = time, threading.Lock(), 0.0

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(self._real, name)


class _ThreadRecordingEnv(FixedLengthEnv):
    """Records the thread each reset runs on; ``reset_s`` makes a reset slow (a scenario load) on the
    collector's clock (a :class:`_Clock`)."""

    def __init__(self, reset_s: float, clock: _Clock, **kw) -> None:
        super().__init__(**kw)
        self.reset_s, self.clock = reset_s, clock
        self.reset_threads: list[str] = []

    def reset(self, *, seed=None, options=None):
        import threading

        self.clock.advance(self.reset_s)
        self.reset_threads.append(threading.current_thread().name)
        return super().reset(seed=seed, options=options)


@pytest.mark.parametrize("reset_s, pooled", [(0.0, False), (0.005, True)])
def test_several_resets_use_the_pool_only_while_resets_are_slow(
    reset_s, pooled, obs_value_policy, monkeypatch
):
    """The first global reset goes to the pool (its cost is unknown); later multi-env resets run
    inline when a reset is cheaper than POOL_RESET_S (a thread hand-off would cost more) and stay
    on the pool when it is slower (I/O-bound scenario loads overlap there)."""
    from fastlight.sampling import collector as collector_module
    from fastlight.sampling import resets as resets_module
    from fastlight.sampling.resets import POOL_RESET_S

    assert reset_s == 0.0 or reset_s > POOL_RESET_S
    clock = _Clock()  # a timed decision, tested on a clock no other process can slow down
    monkeypatch.setattr(collector_module, "time", clock)
    monkeypatch.setattr(resets_module, "time", clock)
    envs = [_ThreadRecordingEnv(reset_s, clock, lengths=(3,), tag=i) for i in range(4)]  # all end together
    c = Collector(envs, mode="dpsa", termination_threshold=1.0)
    for _ in range(3):
        c.collect(obs_value_policy).validate()
    first = [e.reset_threads[0] for e in envs]
    later = [name for e in envs for name in e.reset_threads[1:]]
    assert len(later) == 8
    assert all(name.startswith("fastlight-reset") for name in first)
    assert all(name.startswith("fastlight-reset") == pooled for name in later), later
    assert (c.reset_cost > POOL_RESET_S) == pooled


@pytest.mark.parametrize("mode", ["dpsa", "sgr"])
def test_reset_ahead_gives_the_same_cycles_and_charges_them_its_time(mode, obs_value_policy, monkeypatch):
    """A global reset done ahead (while a sampler waits for weights) changes nothing the cycle
    collects, and its seconds still count in that cycle's reset_time and wall_time."""
    from fastlight.sampling import collector as collector_module
    from fastlight.sampling import resets as resets_module

    clock = _Clock()  # resets cost 5 ms on this clock, steps nothing: the times are exact
    monkeypatch.setattr(collector_module, "time", clock)
    monkeypatch.setattr(resets_module, "time", clock)

    def collector() -> Collector:
        envs = [_ThreadRecordingEnv(0.005, clock, lengths=(2, 5, 3), tag=i) for i in range(3)]
        return Collector(envs, mode=mode, termination_threshold=0.5, max_horizon=6, seed=3)

    plain, ahead = collector(), collector()
    for cycle in range(4):
        a = plain.collect(obs_value_policy).validate()
        ahead.reset_ahead()
        ahead.reset_ahead()  # a second call before the cycle resets nothing more
        assert [e.reset_calls for e in ahead.envs] == [cycle + 1] * 3
        b = ahead.collect(obs_value_policy).validate()
        for field in ("obs", "actions", "rewards", "valid", "terminated", "truncated"):
            assert torch.equal(getattr(a, field), getattr(b, field)), (cycle, field)
        assert b.stats.global_resets == a.stats.global_resets == 1
        # three envs, pooled or inline: at least one 5 ms reset, all inside the cycle's wall time
        # (sums of the same clock readings in another order: equal up to rounding)
        assert b.stats.reset_time == pytest.approx(a.stats.reset_time, abs=1e-12)
        assert b.stats.wall_time == pytest.approx(a.stats.wall_time, abs=1e-12)
        assert b.stats.wall_time >= b.stats.reset_time - 1e-12 >= 0.005 - 2e-12
    assert [e.reset_calls for e in ahead.envs] == [e.reset_calls for e in plain.envs] == [4] * 3


def test_reset_ahead_does_nothing_in_autoreset_mode(obs_value_policy):
    c = Collector(make_envs([2, 3]), mode="autoreset", rollout_steps=4)
    plain = Collector(make_envs([2, 3]), mode="autoreset", rollout_steps=4)
    c.reset_ahead()
    assert [e.reset_calls for e in c.envs] == [0, 0]
    for _ in range(2):
        a, b = plain.collect(obs_value_policy), c.collect(obs_value_policy)
        c.reset_ahead()
        assert torch.equal(a.obs, b.obs)
    # autoreset's own resets only: at the start, then at each end in 8 steps (2, 4, 6, 8 / 3, 6)
    assert [e.reset_calls for e in c.envs] == [e.reset_calls for e in plain.envs] == [5, 3]


def test_a_discarded_reset_ahead_is_done_again_at_the_cycle_start(obs_value_policy):
    c = Collector(make_envs([2, 3]), mode="dpsa", termination_threshold=1.0)
    c.reset_ahead()
    c.discard_ahead()  # e.g. DWR weights arrived after it
    c.collect(obs_value_policy).validate()
    assert [e.reset_calls for e in c.envs] == [2, 2]  # the discarded one, then the cycle's own


def test_group_size_starts_each_group_of_envs_from_one_seed(obs_value_policy):
    """GRPO's groups (``--data.group_size``): consecutive envs share their reset seed, every cycle."""
    import gymnasium as gym

    envs = [gym.make("CartPole-v1") for _ in range(6)]
    c = Collector(envs, mode="dpsa", termination_threshold=1.0, max_horizon=4, seed=7, group_size=3)
    for _ in range(2):  # the second cycle's groups share a new seed
        first = c.collect(obs_value_policy).obs[0]  # [E, 4]: the cycle's initial observations
        assert torch.equal(first[0], first[1]) and torch.equal(first[0], first[2])
        assert torch.equal(first[3], first[5]) and not torch.equal(first[0], first[3])
    c.close()
    with pytest.raises(
        ValueError, match=r"--data.group_size 4 must be >= 1, divide each sampler's envs \(6\)"
    ):
        Collector([gym.make("CartPole-v1") for _ in range(6)], group_size=4)
    with pytest.raises(ValueError, match="run with --data.reset_mode dpsa or sgr"):
        Collector([gym.make("CartPole-v1") for _ in range(2)], mode="autoreset", group_size=2)
