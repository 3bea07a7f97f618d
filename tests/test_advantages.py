"""Masked GAE against a naive per-episode loop; global advantage normalisation (1 and 2 ranks)."""

from __future__ import annotations

import os
import random
import socket
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastlight.advantages import chunk_rewards, global_advantage_moments, masked_gae, normalize_advantages

NAN = float("nan")


# ---------------------------------------------------------------------------- data
def _random_column(t_len: int, rng: random.Random) -> tuple[list[bool], list[bool], list[bool]]:
    """Episodes of random length ending terminated or truncated, separated by padding rows."""
    valid, term, trunc = [False] * t_len, [False] * t_len, [False] * t_len
    t = rng.choice([0, 0, 1])  # sometimes leading padding
    while t < t_len:
        length = rng.randint(1, 6)
        end = min(t + length, t_len) - 1
        for i in range(t, end + 1):
            valid[i] = True
        if t + length > t_len or rng.random() < 0.4:
            trunc[end] = True  # cut by the rollout end / unified truncation / time limit
        else:
            term[end] = True
        t = end + 1 + rng.choice([0, 0, 1, 2, 3])  # DPSA dummy steps after the episode end
    return valid, term, trunc


def _random_rollout(t_len: int, n_env: int, seed: int, garbage: bool) -> dict[str, torch.Tensor]:
    rng = random.Random(seed)
    cols = [_random_column(t_len, rng) for _ in range(n_env)]
    valid, term, trunc = (torch.tensor([c[i] for c in cols]).T.contiguous() for i in range(3))
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(t_len, n_env, generator=g, dtype=torch.float64)
    values = torch.randn(t_len, n_env, generator=g, dtype=torch.float64)
    boot = torch.where(trunc, torch.randn(t_len, n_env, generator=g, dtype=torch.float64), 0.0)
    if garbage:
        rewards = torch.where(valid, rewards, NAN)
        values = torch.where(valid, values, float("inf"))
        boot = torch.where(trunc & valid, boot, NAN)
        # Flags in padded slots are garbage by contract too (even both set at once).
        noise = torch.rand(t_len, n_env, generator=g) < 0.5
        term, trunc = torch.where(valid, term, noise), torch.where(valid, trunc, noise)
    return {"rewards": rewards, "values": values, "bootstrap_values": boot,
            "terminated": term, "truncated": trunc, "valid": valid}  # fmt: skip


def _naive_gae(ro: dict[str, torch.Tensor], gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-Python reference: split each column into episodes, run GAE backwards inside each."""
    t_len, n_env = ro["valid"].shape
    adv = [[0.0] * n_env for _ in range(t_len)]
    ret = [[0.0] * n_env for _ in range(t_len)]
    for e in range(n_env):
        col = {k: v[:, e].tolist() for k, v in ro.items()}
        episodes, current = [], []
        for t in range(t_len):
            if col["valid"][t]:
                current.append(t)
                if col["terminated"][t] or col["truncated"][t]:
                    episodes.append(current)
                    current = []
        assert not current
        for ep in episodes:
            gae = 0.0
            for j in reversed(range(len(ep))):
                t = ep[j]
                if j == len(ep) - 1:
                    next_v = 0.0 if col["terminated"][t] else col["bootstrap_values"][t]
                else:
                    next_v = col["values"][ep[j + 1]]
                delta = col["rewards"][t] + gamma * next_v - col["values"][t]
                gae = delta + gamma * lam * gae
                adv[t][e] = gae
                ret[t][e] = gae + col["values"][t]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


# ---------------------------------------------------------------------------- masked GAE
def test_random_data_has_the_interesting_structure() -> None:
    ro = _random_rollout(40, 16, seed=0, garbage=False)
    v = ro["valid"]
    assert (v[:-1] & ~v[1:]).any() and (~v[:-1] & v[1:]).any()  # padding, then a new episode
    assert (~v[-1]).any()  # trailing padding
    assert (ro["terminated"] & v).any() and (ro["truncated"] & v).any()


@pytest.mark.parametrize("garbage", [False, True])
@pytest.mark.parametrize(("gamma", "lam"), [(0.99, 0.95), (0.9, 1.0), (0.5, 0.0)])
def test_masked_gae_matches_naive_loop(garbage: bool, gamma: float, lam: float) -> None:
    for seed in range(3):
        ro = _random_rollout(40, 16, seed=seed, garbage=garbage)
        adv, ret = masked_gae(**ro, gamma=gamma, lam=lam)
        ref_adv, ref_ret = _naive_gae(ro, gamma, lam)
        torch.testing.assert_close(adv, ref_adv, rtol=0, atol=1e-10)
        torch.testing.assert_close(ret, ref_ret, rtol=0, atol=1e-10)
        assert torch.equal(adv[~ro["valid"]], torch.zeros(int((~ro["valid"]).sum()), dtype=torch.float64))


def test_garbage_does_not_change_result() -> None:
    clean = masked_gae(**_random_rollout(30, 8, seed=5, garbage=False))
    dirty = masked_gae(**_random_rollout(30, 8, seed=5, garbage=True))
    assert torch.equal(clean[0], dirty[0]) and torch.equal(clean[1], dirty[1])


def test_hand_computed_terminated_vs_truncated() -> None:
    def one_env(last_terminated: bool) -> torch.Tensor:
        col = lambda xs: torch.tensor(xs).reshape(3, 1)  # noqa: E731
        adv, _ = masked_gae(
            rewards=col([1.0, 1.0, 1.0]), values=col([0.5, 0.5, 0.5]), bootstrap_values=col([0.0, 0.0, 2.0]),
            terminated=col([False, False, last_terminated]),
            truncated=col([False, False, not last_terminated]),
            valid=col([True, True, True]), gamma=0.5, lam=0.5,
        )  # fmt: skip
        return adv[:, 0]

    # terminated: δ = [1+0.25-0.5, 0.75, 1-0.5] = [0.75, 0.75, 0.5]; A2=0.5, A1=0.75+0.25·0.5, A0=0.75+0.25·A1
    torch.testing.assert_close(one_env(True), torch.tensor([0.96875, 0.875, 0.5]))
    # truncated: bootstrap V(s_3)=2 → δ2 = 1 + 0.5·2 - 0.5 = 1.5
    torch.testing.assert_close(one_env(False), torch.tensor([1.03125, 1.125, 1.5]))


def test_gae_shape_and_dtype_errors() -> None:
    ro = _random_rollout(6, 3, seed=1, garbage=False)
    with pytest.raises(ValueError) as exc:
        masked_gae(**{**ro, "values": torch.zeros(6, 4, dtype=torch.float64)})
    assert "(6, 4)" in str(exc.value) and "(6, 3)" in str(exc.value) and "values" in str(exc.value)
    with pytest.raises(ValueError, match="terminated must be bool"):
        masked_gae(**{**ro, "terminated": ro["terminated"].float()})
    with pytest.raises(ValueError, match=r"\[T, E\]"):
        masked_gae(**{k: v[:, 0] for k, v in ro.items()})
    with pytest.raises(ValueError, match="gamma"):
        masked_gae(**ro, gamma=1.5)


def test_gae_rejects_broken_episode_structure() -> None:
    f, t = False, True
    base = {"rewards": torch.zeros(3, 1), "values": torch.zeros(3, 1), "bootstrap_values": torch.zeros(3, 1)}
    col = lambda xs: torch.tensor(xs).reshape(3, 1)  # noqa: E731
    with pytest.raises(ValueError, match="padding inside an episode"):  # valid, not done, then padding
        masked_gae(**base, terminated=col([f, t, f]), truncated=col([f, f, f]), valid=col([t, f, t]))
    with pytest.raises(ValueError, match="T-1"):  # still running at the end of the rollout
        masked_gae(**base, terminated=col([f, f, f]), truncated=col([f, f, f]), valid=col([t, t, t]))
    with pytest.raises(ValueError, match="both terminated and truncated"):
        masked_gae(**base, terminated=col([f, f, t]), truncated=col([f, f, t]), valid=col([t, t, t]))


# ---------------------------------------------------------------------------- normalisation
def _reference_moments(shards: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    data = torch.cat([a[v].double() for a, v in shards])
    return data.mean().item(), data.std(unbiased=False).item()


def _shards() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    a0 = 3.0 + 2.0 * torch.randn(5, 3, generator=g)
    v0 = torch.rand(5, 3, generator=g) > 0.4
    a1 = -1.0 + 0.5 * torch.randn(9, 4, generator=g)
    v1 = torch.rand(9, 4, generator=g) > 0.2
    return [(torch.where(v0, a0, NAN), v0), (torch.where(v1, a1, NAN), v1)]


def test_single_process_moments_exact_and_no_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    adv, valid = _shards()[1]
    mean, std = global_advantage_moments(adv, valid)
    ref_mean, ref_std = _reference_moments([(adv, valid)])
    assert mean.item() == pytest.approx(ref_mean, abs=1e-6) and std.item() == pytest.approx(ref_std, abs=1e-6)

    def boom(*args, **kwargs):
        raise AssertionError("no collective expected")

    # An initialised world of size 1 must not issue a collective either.
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    monkeypatch.setattr(dist, "all_reduce", boom)
    assert torch.equal(torch.stack(global_advantage_moments(adv, valid)), torch.stack([mean, std]))


def test_normalize_single_process() -> None:
    adv, valid = _shards()[0]
    out = normalize_advantages(adv, valid)
    assert torch.equal(out[~valid], torch.zeros(int((~valid).sum())))
    assert out[valid].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert out[valid].std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)


def test_constant_advantages_hit_the_variance_floor() -> None:
    adv, valid = torch.full((4,), 2.0), torch.tensor([True, True, True, False])
    mean, std = global_advantage_moments(adv, valid)
    assert mean.item() == 2.0 and std.item() == pytest.approx(1e-6)
    assert torch.equal(normalize_advantages(adv, valid), torch.zeros(4))
    mean, std = global_advantage_moments(adv, torch.zeros(4, dtype=torch.bool))  # nothing valid: no NaN
    assert mean.item() == 0.0 and std.item() == pytest.approx(1e-6)


def test_moments_shape_error() -> None:
    with pytest.raises(ValueError) as exc:
        global_advantage_moments(torch.zeros(4, 2), torch.ones(2, dtype=torch.bool))
    assert "(4, 2)" in str(exc.value) and "(2,)" in str(exc.value)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _moments_worker(rank: int, world: int, port: int, shards: list, out_dir: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    try:
        calls = []
        real_all_reduce = dist.all_reduce

        def counting_all_reduce(*args, **kwargs):
            calls.append(1)
            return real_all_reduce(*args, **kwargs)

        dist.all_reduce = counting_all_reduce
        adv, valid = shards[rank]
        mean, std = global_advantage_moments(adv, valid)
        n_calls = len(calls)
        norm = normalize_advantages(adv, valid)
        torch.save(
            {"mean": mean, "std": std, "calls": n_calls, "norm": norm}, Path(out_dir) / f"rank{rank}.pt"
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.multiproc
def test_global_moments_two_gloo_ranks_uneven_shards(tmp_path: Path) -> None:
    shards = _shards()
    ctx = mp.start_processes(
        _moments_worker,
        args=(2, _free_port(), shards, str(tmp_path)),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + 60
    try:
        while not ctx.join(timeout=1):  # raises with the child's traceback if a rank fails
            if time.monotonic() > deadline:
                pytest.fail("gloo ranks did not finish within 60 s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
    ref_mean, ref_std = _reference_moments(shards)
    norms = []
    for rank in range(2):
        out = torch.load(tmp_path / f"rank{rank}.pt")
        assert out["calls"] == 1  # exactly one collective
        assert out["mean"].item() == pytest.approx(ref_mean, abs=1e-6)
        assert out["std"].item() == pytest.approx(ref_std, abs=1e-6)
        valid = shards[rank][1]
        assert torch.equal(out["norm"][~valid], torch.zeros(int((~valid).sum())))
        norms.append(out["norm"][valid].double())
    # Normalised with global statistics, the *union* of valid advantages is standardised
    # (neither shard is on its own: their means are 3 and -1).
    union = torch.cat(norms)
    assert union.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert union.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    assert abs(norms[0].mean().item()) > 0.5


# ---------------------------------------------------------------------------- action chunks
def _chunked_episodes(rng: random.Random, h_max: int) -> list[dict]:
    """Env-step episodes cut into chunks of 1..h_max steps (the last one ends the episode), with a
    reward and a value at every env step; most end terminated, some truncated with a bootstrap."""
    episodes = []
    for _ in range(rng.randint(1, 3)):
        length = rng.randint(1, 12)
        hs, left = [], length
        while left:
            hs.append(min(left, rng.randint(1, h_max)))
            left -= hs[-1]
        episodes.append({
            "r": [rng.gauss(0, 1) for _ in range(length)],
            "v": [rng.gauss(0, 1) for _ in range(length)],
            "hs": hs,
            "term": rng.random() < 0.6,
            "boot": rng.gauss(0, 1),
        })  # fmt: skip
    return episodes


def _naive_env_step_gae(ep: dict, gamma: float, lam: float) -> list[float]:
    """Per-env-step GAE with λ = 1 inside a chunk and λ at its last step: the advantages at the chunk
    starts are the semi-MDP GAE of the chunk transitions (the inner values cancel out)."""
    r, v, length = ep["r"], ep["v"], len(ep["r"])
    chunk_ends = set(np.cumsum(ep["hs"]) - 1)
    end_v = 0.0 if ep["term"] else ep["boot"]
    adv, a = [0.0] * length, 0.0
    for s in reversed(range(length)):
        v_next = end_v if s == length - 1 else v[s + 1]
        carry = 0.0 if s == length - 1 else a
        a = r[s] + gamma * v_next - v[s] + gamma * (lam if s in chunk_ends else 1.0) * carry
        adv[s] = a
    starts = np.cumsum([0, *ep["hs"][:-1]])
    return [adv[s] for s in starts]


def _chunk_columns(columns: list[list[dict]], h_max: int) -> dict[str, torch.Tensor]:
    """The chunk transitions of every column as a [T, E] rollout (NaN garbage in padding and past
    each chunk's executed steps), and the expected advantages, from a naive loop."""
    rows: list[list[dict]] = []
    for eps in columns:
        col = []
        for ep in eps:
            start = 0
            for j, h in enumerate(ep["hs"]):
                last = j == len(ep["hs"]) - 1
                col.append({
                    "step_rewards": ep["r"][start : start + h] + [NAN] * (h_max - h), "env_steps": h,
                    "values": ep["v"][start], "valid": True, "term": last and ep["term"],
                    "trunc": last and not ep["term"], "boot": ep["boot"] if last and not ep["term"] else NAN,
                })  # fmt: skip
                start += h
            col.append({"step_rewards": [NAN] * h_max, "env_steps": 0, "values": NAN, "valid": False,
                        "term": False, "trunc": False, "boot": NAN})  # fmt: skip  # DPSA dummy step
        rows.append(col)
    t_len = max(len(c) for c in rows)
    pad = {"step_rewards": [NAN] * h_max, "env_steps": 0, "values": NAN, "valid": False, "term": False,
           "trunc": False, "boot": NAN}  # fmt: skip
    grid = [[c[t] if t < len(c) else pad for c in rows] for t in range(t_len)]
    field = lambda k, dtype: torch.tensor([[x[k] for x in row] for row in grid], dtype=dtype)  # noqa: E731
    return {
        "step_rewards": field("step_rewards", torch.float64),
        "env_steps": field("env_steps", torch.long),
        "values": field("values", torch.float64),
        "bootstrap_values": field("boot", torch.float64),
        "terminated": field("term", torch.bool),
        "truncated": field("trunc", torch.bool),
        "valid": field("valid", torch.bool),
    }


def test_chunk_rewards_are_the_discounted_sums_of_the_executed_steps() -> None:
    rng = random.Random(0)
    step_rewards = torch.tensor([[[rng.gauss(0, 1) for _ in range(4)] for _ in range(3)] for _ in range(5)])
    env_steps = torch.tensor([[rng.randint(0, 4) for _ in range(3)] for _ in range(5)])
    garbage = step_rewards.clone()
    for t in range(5):
        for e in range(3):
            garbage[t, e, int(env_steps[t, e]) :] = NAN  # never executed: never read
    rewards, discounts = chunk_rewards(garbage, env_steps, 0.9)
    for t in range(5):
        for e in range(3):
            h = int(env_steps[t, e])
            expected = sum(0.9**i * float(step_rewards[t, e, i]) for i in range(h))
            assert rewards[t, e].item() == pytest.approx(expected, abs=1e-5)
            assert discounts[t, e].item() == pytest.approx(0.9**h, rel=1e-6)
    with pytest.raises(ValueError, match=r"step_rewards must be \[T, E, H\]"):
        chunk_rewards(step_rewards[0], env_steps, 0.9)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("gamma, lam", [(0.99, 0.95), (0.9, 0.0), (0.97, 1.0), (1.0, 0.5)])
def test_chunk_gae_matches_a_naive_env_step_loop(seed: int, gamma: float, lam: float) -> None:
    """A chunk transition's advantage is the env-step GAE at its first step with λ = 1 inside the
    chunk: λ = 0 gives the chunk's n-step TD error, λ = 1 the discounted Monte-Carlo return."""
    rng = random.Random(seed)
    h_max = 4
    columns = [_chunked_episodes(rng, h_max) for _ in range(rng.randint(1, 4))]
    ro = _chunk_columns(columns, h_max)
    rewards, discounts = chunk_rewards(ro["step_rewards"], ro["env_steps"], gamma)
    adv, ret = masked_gae(
        rewards=rewards, values=ro["values"], bootstrap_values=ro["bootstrap_values"],
        terminated=ro["terminated"], truncated=ro["truncated"], valid=ro["valid"],
        gamma=gamma, lam=lam, discounts=discounts,
    )  # fmt: skip
    for e, eps in enumerate(columns):
        expected = [a for ep in eps for a in _naive_env_step_gae(ep, gamma, lam)]
        got = adv[:, e][ro["valid"][:, e]].tolist()
        assert got == pytest.approx(expected, abs=1e-9)
    assert torch.equal(adv[~ro["valid"]], torch.zeros(int((~ro["valid"]).sum()), dtype=torch.float64))
    values = torch.where(ro["valid"], ro["values"], torch.zeros((), dtype=torch.float64))
    torch.testing.assert_close(
        ret, torch.where(ro["valid"], adv + values, torch.zeros((), dtype=torch.float64))
    )
    if lam == 1.0:  # the discounted Monte-Carlo return over env steps, bootstrapped at a truncation
        ep = columns[0][0]
        end_v = 0.0 if ep["term"] else ep["boot"]
        mc = sum(gamma**i * x for i, x in enumerate(ep["r"])) + gamma ** len(ep["r"]) * end_v
        assert ret[0, 0].item() == pytest.approx(mc, abs=1e-9)


def test_rl_module_discounts_chunks_and_keeps_todays_path_without_them() -> None:
    """Without chunk fields the module calls the unchanged GAE (bitwise); with them it discounts each
    transition by gamma^h over its executed steps."""
    from fastlight.modules.rl_module import RLModule
    from fastlight.rollout import Rollout

    m = RLModule(obs_dim=3, action_dim=2, gamma=0.9, gae_lambda=0.7, normalize_advantages=False,
                 normalize_obs=False, normalize_returns=False)  # fmt: skip
    m.configure_model()
    rng = random.Random(3)
    columns = [_chunked_episodes(rng, 3) for _ in range(3)]
    ro = {k: v.float() if v.is_floating_point() else v for k, v in _chunk_columns(columns, 3).items()}
    t_len, n_env = ro["valid"].shape
    zeros = torch.zeros(t_len, n_env)
    common = dict(obs=torch.zeros(t_len, n_env, 3), actions=torch.zeros(t_len, n_env, dtype=torch.long),
                  logprobs=zeros, values=ro["values"], terminated=ro["terminated"], truncated=ro["truncated"],
                  valid=ro["valid"], step=torch.zeros(t_len, n_env, dtype=torch.long),
                  task_id=torch.zeros(t_len, n_env, dtype=torch.long),
                  policy_version=torch.zeros(t_len, n_env, dtype=torch.long),
                  bootstrap_values=ro["bootstrap_values"])  # fmt: skip
    rewards = torch.where(ro["valid"], ro["step_rewards"].nan_to_num().sum(-1), zeros)
    gae = dict(values=ro["values"], bootstrap_values=ro["bootstrap_values"], terminated=ro["terminated"],
               truncated=ro["truncated"], valid=ro["valid"], gamma=0.9, lam=0.7)  # fmt: skip
    plain = Rollout(rewards=rewards, **common)
    adv, ret, _ = m.compute_advantages(plain)
    ref = masked_gae(rewards=rewards, **gae)
    assert torch.equal(adv, ref[0]) and torch.equal(ret, ref[1])
    env_steps = torch.where(ro["valid"], ro["env_steps"], torch.zeros((), dtype=torch.long))
    chunked = Rollout(rewards=rewards, step_rewards=ro["step_rewards"], env_steps=env_steps, **common)
    adv, ret, _ = m.compute_advantages(chunked)
    r, g = chunk_rewards(ro["step_rewards"], env_steps, 0.9)
    ref = masked_gae(rewards=r, discounts=g, **gae)
    assert torch.equal(adv, ref[0]) and torch.equal(ret, ref[1])
    assert not torch.allclose(adv, m.compute_advantages(plain)[0])  # gamma^h is not gamma


def grpo_loop(rewards, terminated, truncated, valid, group_size):
    """Naive GRPO: walk each column's clips, then standardise each clip's return within its group."""
    t_len, n_env = rewards.shape
    returns = [[] for _ in range(n_env)]  # per column: [return, [steps]] per clip
    for e in range(n_env):
        total, steps = 0.0, []
        for t in range(t_len):
            if not valid[t, e]:
                continue
            total, steps = total + float(rewards[t, e]), [*steps, t]
            if terminated[t, e] or truncated[t, e]:
                returns[e].append((total, steps))
                total, steps = 0.0, []
    adv = torch.zeros(t_len, n_env, dtype=torch.float64)
    mean_len = sum(len(steps) for col in returns for _, steps in col) / sum(len(col) for col in returns)
    for g in range(0, n_env, group_size):
        for c in range(len(returns[g])):
            r = torch.tensor([returns[e][c][0] for e in range(g, g + group_size)], dtype=torch.float64)
            z = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
            for k, e in enumerate(range(g, g + group_size)):
                for t in returns[e][c][1]:
                    adv[t, e] = z[k] * mean_len / len(returns[e][c][1])
    return adv


def two_cycles(*, seed: int, n_env: int):
    """Random rewards over two sampling cycles of 6 rows: each column's clip starts at its cycle's first
    row and ends (terminated or truncated) at its own step, then dummy (invalid) steps."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(12, n_env, generator=g, dtype=torch.float64)
    valid = torch.zeros(12, n_env, dtype=torch.bool)
    terminated, truncated = torch.zeros_like(valid), torch.zeros_like(valid)
    ends = torch.randint(0, 6, (2, n_env), generator=g)
    for c in range(2):
        for e in range(n_env):
            end = 6 * c + int(ends[c, e])
            valid[6 * c : end + 1, e] = True
            (terminated if (c + e) % 2 else truncated)[end, e] = True
    return rewards, terminated, truncated, valid


def test_group_relative_advantages_match_a_naive_loop_over_clips_and_groups():
    from fastlight.advantages import group_relative_advantages

    n_env, group = 6, 3
    rewards, terminated, truncated, valid = two_cycles(seed=3, n_env=n_env)
    rewards[2, 1] = float("nan")  # garbage where invalid must not leak (made invalid below when there)
    if valid[2, 1]:
        rewards[2, 1] = 0.5
    adv = group_relative_advantages(
        rewards=rewards, terminated=terminated, truncated=truncated, valid=valid, group_size=group
    )
    torch.testing.assert_close(
        adv, grpo_loop(rewards, terminated, truncated, valid, group), rtol=1e-9, atol=1e-9
    )
    # each group's steps sum to 0 in every cycle: a short successful clip weighs what a long failure does
    for cycle in range(2):
        rows = slice(6 * cycle, 6 * cycle + 6)
        sums = adv[rows].sum(0).view(-1, group).sum(1)
        torch.testing.assert_close(sums, torch.zeros_like(sums), rtol=0, atol=1e-9)
    # a group whose clips earned the same return (1, paid at each clip's last step) says nothing
    flat = group_relative_advantages(
        rewards=((terminated | truncated) & valid).double(),
        terminated=terminated,
        truncated=truncated,
        valid=valid,
        group_size=2,
    )
    assert bool((flat == 0).all())
    with pytest.raises(ValueError, match="group_size 4 must be >= 1 and divide the rollout's 6 columns"):
        group_relative_advantages(
            rewards=rewards, terminated=terminated, truncated=truncated, valid=valid, group_size=4
        )


def group_steps_loop(rewards, terminated, truncated, valid, group_size, gamma):
    """Naive per-step group advantages: reward-to-go per clip, minus the other valid columns' at that row."""
    t_len, n_env = rewards.shape
    togo = torch.zeros(t_len, n_env, dtype=torch.float64)
    for e in range(n_env):
        acc = 0.0
        for t in reversed(range(t_len)):
            if not valid[t, e]:
                continue
            if terminated[t, e] or truncated[t, e]:
                acc = 0.0
            acc = float(rewards[t, e]) + gamma * acc
            togo[t, e] = acc
    adv = torch.zeros_like(togo)
    for t in range(t_len):
        for e in range(n_env):
            g0 = e - e % group_size
            others = [o for o in range(g0, g0 + group_size) if o != e and valid[t, o]]
            if valid[t, e] and others:
                adv[t, e] = togo[t, e] - sum(float(togo[t, o]) for o in others) / len(others)
    return adv


def test_group_step_advantages_match_a_naive_loop_and_need_aligned_clips():
    from fastlight.advantages import group_step_advantages

    n_env, group = 6, 3
    rewards, terminated, truncated, valid = two_cycles(seed=4, n_env=n_env)
    rewards[~valid] = float("nan")  # padding must not leak
    ends_kw = {"terminated": terminated, "truncated": truncated, "valid": valid}
    adv = group_step_advantages(rewards=rewards, group_size=group, gamma=0.9, **ends_kw)
    ref = group_steps_loop(rewards, terminated, truncated, valid, group, 0.9)
    torch.testing.assert_close(adv, ref, rtol=1e-9, atol=1e-9)
    assert bool((adv[~valid] == 0).all()) and bool((adv != 0).any())
    # clips that do not start together cannot be compared step by step
    shifted = valid.clone()
    shifted[0, 0] = False  # column 0's first clip starts a row late
    with pytest.raises(ValueError, match="same rows"):
        group_step_advantages(
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            valid=shifted,
            group_size=group,
            gamma=0.9,
        )
