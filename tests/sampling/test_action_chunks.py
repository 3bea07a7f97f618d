"""Action chunks in the Collector: open-loop chunks, one transition per chunk, env-step counting.

Every Rollout field is checked against a plain Python loop over env steps with known rewards
(step ``t`` of env ``e`` pays ``10 e + t``) and known termination steps inside chunks.
"""

from __future__ import annotations

import math
import random

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastlight.advantages import chunk_rewards, masked_gae
from fastlight.models.action_mapping import ChunkActions, IdentityActions, action_chunk
from fastlight.models.base import ActOutput, EvalOutput
from fastlight.sampling.collector import Collector
from fastlight.sampling.env_faults import NonFiniteError
from tests.fake_envs import FaultEnv, FixedLengthEnv

D = 2  # action dimensions


class StepRewardEnv(gym.Env):
    """Episode ``k`` lasts ``lengths[k % len(lengths)]`` steps, then terminates (truncates with
    ``truncate``). Step ``t`` (1-based) pays ``10 * tag + t``; obs ``[tag, t, 1]``; every action
    received is kept in ``actions``."""

    def __init__(self, lengths: tuple[int, ...], tag: int, truncate: bool = False) -> None:
        self.lengths, self.tag, self.truncate = list(lengths), tag, truncate
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (D,), np.float32)
        self.episode, self.t, self.step_calls = -1, 0, 0
        self.actions: list[list[float]] = []

    def _obs(self) -> np.ndarray:
        return np.array([self.tag, self.t, 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.step_calls += 1
        self.t += 1
        self.actions.append(np.asarray(action, dtype=np.float64).round(4).tolist())
        end = self.t >= self.lengths[self.episode % len(self.lengths)]
        return (
            self._obs(),
            float(10 * self.tag + self.t),
            end and not self.truncate,
            end and self.truncate,
            {},
        )


class ChunkPolicy(torch.nn.Module):
    """Acts in chunks of ``chunk`` (``None``: one action per call, no chunk axis). The token of chunk
    step ``k``, dimension ``d`` chosen at episode step ``s`` is ``100 s + k + d / 10``, so the env's
    record shows which call and which chunk step each executed action came from. V(s) = 10 tag + t."""

    def __init__(self, chunk: int | None) -> None:
        super().__init__()
        self.chunk = chunk
        self.w = torch.nn.Parameter(torch.zeros(1))

    def _v(self, obs):
        return 10 * obs[:, 0] + obs[:, 1]

    def act(self, obs, *, step=None, deterministic=False):
        h = self.chunk or 1
        k = torch.arange(h).repeat_interleave(D).float()
        d = torch.arange(D).repeat(h).float()
        actions = 100 * obs[:, 1:2] + k + d / 10  # [N, H*D]
        return ActOutput(actions, torch.zeros_like(actions), self._v(obs))

    def evaluate(self, obs, actions, *, step=None):
        return EvalOutput(torch.zeros_like(actions) + self.w, torch.zeros_like(actions), self._v(obs))

    def value(self, obs, *, step=None):
        return self._v(obs)

    def action_mapping(self):
        return IdentityActions() if self.chunk is None else ChunkActions(IdentityActions(), self.chunk)

    def env_action(self, actions):
        return self.action_mapping()(actions)


def envs_of(lengths, truncate=False) -> list[StepRewardEnv]:
    return [
        StepRewardEnv(n if isinstance(n, tuple) else (n,), tag=e, truncate=truncate)
        for e, n in enumerate(lengths)
    ]


def _empty_row(num_envs: int, h: int) -> dict[str, list]:
    keys = ("valid", "term", "trunc", "step", "boot", "env_steps", "rewards", "step_rewards")
    row = {k: [] for k in keys}
    for _ in range(num_envs):
        for k, v in zip(keys, (False, False, False, 0, 0.0, 0, 0.0, [0.0] * h), strict=True):
            row[k].append(v)
    return row


def _run_chunk(
    e: int, t: list[int], length: int, span: int, executed: list[list]
) -> tuple[list[float], bool]:
    """Env ``e`` runs a chunk from episode step ``t[e]`` for at most ``span`` steps: its rewards, and
    whether the episode ended inside it."""
    start, rewards = t[e], []
    for k in range(span):
        t[e] += 1
        rewards.append(float(10 * e + t[e]))
        executed[e].append([100 * start + k + d / 10 for d in range(D)])
        if t[e] == length:
            return rewards, True
    return rewards, False


def _fill(row: dict, e: int, h: int, start: int, rewards: list[float]) -> None:
    row["valid"][e], row["step"][e], row["env_steps"][e] = True, start, len(rewards)
    row["rewards"][e] = sum(rewards)
    row["step_rewards"][e] = rewards + [0.0] * (h - len(rewards))


def naive_cycle(lengths, h, threshold, max_horizon, *, sgr=False, truncate=False):
    """One DPSA/SGR cycle, env step by env step: rows of every field, episodes (env, length, term,
    trunc, cut, return) and the actions each env executed."""
    n = len(lengths)
    t, alive, elapsed = [0] * n, [True] * n, 0
    rows, episodes, executed = [], [], [[] for _ in range(n)]
    while True:
        span = min(h, max_horizon - elapsed)
        row = _empty_row(n, h)
        for e in range(n):
            if not alive[e]:
                continue
            start = t[e]
            rewards, end = _run_chunk(e, t, lengths[e], span, executed)
            _fill(row, e, h, start, rewards)
            if end:
                alive[e] = False
                row["term" if not truncate else "trunc"][e] = True
                row["boot"][e] = float(10 * e + t[e]) if truncate else 0.0
                episodes.append((e, t[e], not truncate, truncate, False))
        elapsed += span
        ended = n - sum(alive)
        cut = elapsed >= max_horizon or (ended >= 1 if sgr else ended / n >= threshold - 1e-9)
        if cut:
            for e in range(n):
                if alive[e]:
                    row["trunc"][e], row["boot"][e] = True, float(10 * e + t[e])
                    episodes.append((e, t[e], False, True, True))
        rows.append(row)
        if cut:
            return rows, episodes, executed


def naive_autoreset(lengths, h, rollout_steps):
    """``ceil(rollout_steps / h)`` policy steps of autoreset: envs reset alone and start a fresh chunk."""
    n = len(lengths)
    t, episode = [0] * n, [0] * n
    rows, episodes, executed = [], [], [[] for _ in range(n)]
    policy_steps = math.ceil(rollout_steps / h)
    for r in range(policy_steps):
        span = min(h, rollout_steps - r * h)
        row = _empty_row(n, h)
        for e in range(n):
            start = t[e]
            length = lengths[e][episode[e] % len(lengths[e])]
            rewards, end = _run_chunk(e, t, length, span, executed)
            _fill(row, e, h, start, rewards)
            if end:
                row["term"][e] = True
                episodes.append((e, t[e], True, False, False))
                t[e], episode[e] = 0, episode[e] + 1
            elif r == policy_steps - 1:
                row["trunc"][e], row["boot"][e] = True, float(10 * e + t[e])
        rows.append(row)
    return rows, episodes, executed


def assert_matches(r, rows, episodes, executed, envs) -> None:
    col = lambda key: [row[key] for row in rows]  # noqa: E731
    assert r.validate().chunked
    assert r.valid.tolist() == col("valid")
    assert r.terminated.tolist() == col("term")
    assert r.truncated.tolist() == col("trunc")
    assert r.step.tolist() == col("step")
    assert r.env_steps.tolist() == col("env_steps")
    assert r.rewards.tolist() == col("rewards")
    assert r.step_rewards.tolist() == col("step_rewards")
    assert r.bootstrap_values.tolist() == col("boot")
    got = sorted((e.task_id, e.length, e.terminated, e.truncated, e.cut) for e in r.stats.episodes)
    # task_id is 0 for every env: compare the (length, outcome) multiset and the returns per env instead
    assert got == sorted((0, *ep[1:]) for ep in episodes)
    assert [env.actions for env in envs] == executed
    # Env steps, not chunks: every executed step counts once, every dummy or dropped one not at all.
    assert r.stats.valid_steps == sum(env.step_calls for env in envs) == int(r.env_steps.sum())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("h", [2, 3, 4])
@pytest.mark.parametrize("threshold", [0.25, 0.5, 1.0])
def test_dpsa_chunks_match_a_naive_env_step_loop(seed, h, threshold):
    rng = random.Random(100 * seed + h)
    lengths = [rng.randint(1, 14) for _ in range(rng.randint(1, 6))]
    horizon = rng.choice([7, 9, 10])
    envs = envs_of(lengths)
    r = Collector(envs, mode="dpsa", termination_threshold=threshold, max_horizon=horizon).collect(
        ChunkPolicy(h)
    )
    rows, episodes, executed = naive_cycle(lengths, h, threshold, horizon)
    assert_matches(r, rows, episodes, executed, envs)
    # Raw slots span each policy step's env-step budget (the last one cut to max_horizon).
    spans = [min(h, horizon - h * i) for i in range(len(rows))]
    assert r.stats.raw_steps == len(lengths) * sum(spans) and sum(spans) <= horizon


@pytest.mark.parametrize("seed", range(3))
def test_sgr_and_time_limits_inside_chunks_match_the_naive_loop(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(2, 11) for _ in range(4)]
    for sgr, truncate in ((True, False), (False, True)):
        envs = envs_of(lengths, truncate=truncate)
        mode = "sgr" if sgr else "dpsa"
        r = Collector(envs, mode=mode, termination_threshold=1.0, max_horizon=50).collect(ChunkPolicy(3))
        assert_matches(r, *naive_cycle(lengths, 3, 1.0, 50, sgr=sgr, truncate=truncate), envs)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("h, rollout_steps", [(2, 8), (3, 8), (4, 4), (5, 12)])
def test_autoreset_chunks_match_a_naive_env_step_loop(seed, h, rollout_steps):
    rng = random.Random(seed)
    lengths = [tuple(rng.randint(1, 7) for _ in range(3)) for _ in range(rng.randint(1, 4))]
    envs = envs_of(lengths)
    c = Collector(envs, mode="autoreset", rollout_steps=rollout_steps)
    r = c.collect(ChunkPolicy(h))
    assert r.shape[0] == math.ceil(rollout_steps / h)
    assert_matches(r, *naive_autoreset(lengths, h, rollout_steps), envs)


def test_a_termination_inside_a_chunk_stops_the_env_there():
    """The worked example: chunks of 4; env 0 ends at env step 6 (inside its second chunk), env 1
    at step 9 (one step into its third)."""
    envs = envs_of([6, 9])
    r = Collector(envs, mode="dpsa", termination_threshold=1.0, max_horizon=100).collect(ChunkPolicy(4))
    assert r.shape == (3, 2)
    assert r.env_steps.tolist() == [[4, 4], [2, 4], [0, 1]]
    assert r.step_rewards.tolist() == [
        [[1, 2, 3, 4], [11, 12, 13, 14]],
        [[5, 6, 0, 0], [15, 16, 17, 18]],
        [[0, 0, 0, 0], [19, 0, 0, 0]],
    ]
    assert r.rewards.tolist() == [[10, 50], [11, 66], [0, 19]]
    assert r.terminated.tolist() == [[False, False], [True, False], [False, True]]
    assert r.valid.tolist() == [[True, True], [True, True], [False, True]]
    assert r.step.tolist() == [[0, 0], [4, 4], [0, 8]]  # the episode's env step at the chunk's start
    assert [e.step_calls for e in envs] == [6, 9]  # the rest of env 0's chunk never reached the env
    assert envs[0].actions[-2:] == [[400.0, 400.1], [401.0, 401.1]]  # chunk 2, steps 0 and 1
    assert sorted((e.length, e.ret) for e in r.stats.episodes) == [(6, 21.0), (9, 135.0)]
    assert (r.stats.valid_steps, r.stats.raw_steps) == (15, 24)  # 2 envs x 3 chunks x 4 slots


def test_max_horizon_cuts_the_last_chunk_and_bootstraps_after_the_executed_steps():
    envs = envs_of([20, 5])
    r = Collector(envs, mode="dpsa", termination_threshold=1.0, max_horizon=6).collect(ChunkPolicy(4))
    assert r.env_steps.tolist() == [[4, 4], [2, 1]]
    assert r.truncated.tolist() == [[False, False], [True, False]]
    assert r.terminated[1].tolist() == [False, True]
    assert r.bootstrap_values[1].tolist() == [6.0, 0.0]  # V(s_6) of env 0 (tag 0, step 6)
    cut = [e for e in r.stats.episodes if e.cut]
    assert [(e.length, e.ret) for e in cut] == [(6, 21.0)]
    assert (r.stats.valid_steps, r.stats.raw_steps) == (11, 2 * 6)


def test_a_chunk_length_one_gives_todays_rollout_and_advantages():
    """A chunked mapping with H = 1 runs the same env steps as an unchunked policy: every shared
    field is bitwise equal, the chunk fields are the trivial ones, and GAE agrees."""
    rng = random.Random(5)
    lengths = [rng.randint(1, 12) for _ in range(5)]
    plain = Collector(envs_of(lengths), mode="dpsa", termination_threshold=0.5, max_horizon=9)
    chunked = Collector(envs_of(lengths), mode="dpsa", termination_threshold=0.5, max_horizon=9)
    a, b = plain.collect(ChunkPolicy(None)), chunked.collect(ChunkPolicy(1))
    assert not a.chunked and b.chunked
    shared = ("obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated", "valid", "step")
    for name in (*shared, "bootstrap_values"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(b.step_rewards[..., 0], a.rewards) and torch.equal(b.env_steps, a.valid.long())
    assert (a.stats.raw_steps, a.stats.valid_steps) == (b.stats.raw_steps, b.stats.valid_steps)
    kw = dict(values=a.values, bootstrap_values=a.bootstrap_values, terminated=a.terminated,
              truncated=a.truncated, valid=a.valid, gamma=0.9, lam=0.8)  # fmt: skip
    rewards, discounts = chunk_rewards(b.step_rewards, b.env_steps, 0.9)
    assert torch.equal(rewards, a.rewards)
    today = masked_gae(rewards=a.rewards, **kw)
    for x, y in zip(today, masked_gae(rewards=rewards, discounts=discounts, **kw), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


def test_auto_threshold_sees_env_step_lengths_and_env_step_time():
    envs = envs_of([2, 7, 7, 7])
    c = Collector(envs, mode="dpsa", termination_threshold="auto", max_horizon=50)
    r = c.collect(ChunkPolicy(3))  # the first cycles explore at threshold 1.0: every env ends
    assert sorted(c.chooser.lengths) == [(2, True), (7, True), (7, True), (7, True)]
    costs = c.chooser.costs[-1]
    assert (costs.rounds, costs.env_steps) == (9, 2 + 3 * 7)  # 3 chunks of 3 env steps; steps executed
    assert r.stats.valid_steps == 23 and r.stats.threshold_sum == 1.0


def test_a_nonfinite_step_inside_a_chunk_drops_the_episode_or_names_the_step():
    envs = [FaultEnv(length=10, nan_reward_at=6), FixedLengthEnv(lengths=(10,), tag=1)]
    c = Collector(envs, mode="dpsa", termination_threshold=1.0, max_horizon=12, nonfinite="drop")
    r = c.collect(ChunkPolicy(4)).validate()
    # Env 0's episode (its 2 transitions) is padding; it stopped at the NaN step, 2 steps into chunk 2.
    assert r.valid[:, 0].tolist() == [False, False, False] and envs[0].step_calls == 6
    assert r.env_steps[:, 1].tolist() == [4, 4, 2] and r.stats.dropped_nonfinite == 1
    assert r.stats.valid_steps == 10 and [e.length for e in r.stats.episodes] == [10]
    # Autoreset: the dropped episode (env steps 4-6) is the env's second, so only its 2 transitions
    # (not its 3 env steps' worth of rows, nor the first episode's) become padding.
    auto = Collector(
        [FaultEnv(length=3, nan_reward_at=6)], mode="autoreset", rollout_steps=10, nonfinite="drop"
    )
    r = auto.collect(ChunkPolicy(2)).validate()
    assert r.valid[:, 0].tolist() == [True, True, False, False, True]
    assert r.env_steps[:, 0].tolist() == [2, 1, 0, 0, 2] and r.terminated[:, 0].tolist()[:2] == [False, True]
    raising = Collector([FaultEnv(length=10, nan_reward_at=6)], mode="dpsa", termination_threshold=1.0)
    with pytest.raises(NonFiniteError, match="non-finite reward at episode step 6"):
        raising.collect(ChunkPolicy(4))


def test_the_chunk_is_read_from_the_mapping_type():
    assert action_chunk(ChunkPolicy(3).action_mapping()) == 3
    assert action_chunk(ChunkPolicy(None).action_mapping()) is None
    with pytest.raises(ValueError, match="action_chunk must be an int >= 1"):
        ChunkActions(IdentityActions(), 0)
    out = ChunkActions(IdentityActions(), 3)(torch.arange(12.0).reshape(2, 6))
    assert out.shape == (2, 3, 2) and out[1, 2].tolist() == [10.0, 11.0]  # step-major


def test_evaluation_plays_chunks_open_loop_and_counts_env_steps():
    from fastlight.evaluation import play_episodes, policy_batch_act_fn, seeded_specs

    env = StepRewardEnv((5,), tag=1)
    policy = ChunkPolicy(2)
    calls = []
    act = policy_batch_act_fn(policy)

    def counted(obs, step):
        calls.append(step.tolist())
        return act(obs, step)

    chunk = action_chunk(policy.action_mapping())
    [ep] = play_episodes(counted, [env], seeded_specs(1, 0), action_chunk=chunk)
    assert (ep.length, ep.ret, ep.terminated) == (5, 10.0 * 5 + 15, True)
    assert calls == [[0], [2], [4]]  # ceil(5 / 2) policy calls, at env steps 0, 2, 4
    assert env.actions == [[0.0, 0.1], [1.0, 1.1], [200.0, 200.1], [201.0, 201.1], [400.0, 400.1]]


def test_chunk_fields_survive_padding_joins_and_the_pipe():
    from fastlight.rollout import Rollout
    from fastlight.sampling.worker import rollout_from_numpy, rollout_to_numpy

    a = Collector(envs_of([3, 9]), mode="dpsa", termination_threshold=1.0).collect(ChunkPolicy(2))
    b = Collector(envs_of([2]), mode="dpsa", termination_threshold=1.0).collect(ChunkPolicy(2))
    wide = Rollout.cat([a, b]).validate()  # b padded from 1 to 5 rows
    assert wide.step_rewards.shape == (5, 3, 2) and wide.env_steps[:, 2].tolist() == [2, 0, 0, 0, 0]
    assert wide.num_env_steps == 3 + 9 + 2 and torch.equal(wide.step_rewards[:, :2], a.step_rewards)
    long = Rollout.cat([a, a], dim=0).validate()
    assert long.env_steps.shape == (10, 2) and long.num_env_steps == 2 * 12
    back = rollout_from_numpy(rollout_to_numpy(a)).validate()
    assert torch.equal(back.step_rewards, a.step_rewards) and torch.equal(back.env_steps, a.env_steps)
    plain = Collector(envs_of([2]), mode="dpsa", termination_threshold=1.0).collect(ChunkPolicy(None))
    with pytest.raises(ValueError, match=r"same action chunks, got \['H=2', 'no chunks'\]"):
        Rollout.cat([a, plain])
    broken = Rollout(**{**a.__dict__, "env_steps": a.env_steps + 5})
    with pytest.raises(ValueError, match=r"env_steps must be integers in \[1, H=2\]"):
        broken.validate()
