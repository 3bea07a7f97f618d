"""InferenceServer batching in one process: max_batch, max_wait_ms, stragglers first, results."""

from __future__ import annotations

import multiprocessing as mp
import time

import torch

from fastlight.models.mlp import MLPActorCritic
from fastlight.sampling.inference import InferenceServer, RemotePolicy, Slot, tensor_spec


def make_server(rows: list[int], *, max_batch: int, max_wait_ms: float):
    policy = MLPActorCritic(3, 2)
    example = torch.zeros(1, 3)
    out = policy.act(example)
    act_spec = {"actions": ((), out.actions.dtype), "logprobs": ((), out.logprobs.dtype)}
    slots = [Slot.allocate(n, tensor_spec(example), act_spec) for n in rows]
    pipes = [mp.Pipe() for _ in rows]
    server = InferenceServer(
        policy,
        slots,
        [a for a, _ in pipes],
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        device=torch.device("cpu"),
    )
    server.version = 7
    return server, slots, [b for _, b in pipes], policy


def test_stragglers_first_and_max_batch():
    server, slots, ends, _ = make_server([4, 4, 4], max_batch=8, max_wait_ms=1.0)
    for i, progress in enumerate([50, 10, 30]):  # sampler 1 is furthest behind
        slots[i].obs[""][:4] = torch.randn(4, 3)
        ends[i].send(("act", 4, progress))
    server.poll(0.1)
    first = server.gather()
    assert [r.index for r in first] == [1, 2]  # 8 rows fit: the two least advanced samplers
    second = server.gather()
    assert [r.index for r in second] == [0]


def test_max_wait_bounds_the_batching_delay():
    server, slots, ends, _ = make_server([2], max_batch=64, max_wait_ms=30.0)
    ends[0].send(("act", 2, 0))
    t0 = time.perf_counter()
    batch = server.gather()
    waited = time.perf_counter() - t0
    assert [r.rows for r in batch] == [2]
    assert 0.02 <= waited < 0.5  # waited for more requests, but not much past max_wait_ms


def test_served_results_match_the_policy_and_carry_the_version():
    server, slots, ends, policy = make_server([3, 2], max_batch=8, max_wait_ms=1.0)
    obs = [torch.randn(3, 3), torch.randn(2, 3)]
    for i, o in enumerate(obs):
        slots[i].obs[""][: len(o)] = o
        ends[i].send(("value", len(o), 0))
    server.poll(0.1)
    server.serve(server.gather())
    for i, o in enumerate(obs):
        assert ends[i].recv() == 7
        torch.testing.assert_close(slots[i].values[: len(o)], policy.value(o).detach())


def test_remote_policy_round_trip_through_a_thread():
    import threading

    server, slots, ends, policy = make_server([2], max_batch=8, max_wait_ms=1.0)
    remote = RemotePolicy(slots[0], ends[0])

    def serve_once():
        server.poll(1.0)
        server.serve(server.gather())

    t = threading.Thread(target=serve_once)
    t.start()
    o = torch.randn(2, 3)
    v = remote.value(o)
    t.join()
    assert remote.last_version == 7
    torch.testing.assert_close(v, policy.value(o).detach())
