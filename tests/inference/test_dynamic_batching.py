"""InferenceServer batching in one process: max_batch, max_wait_ms, stragglers first, results."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from fastlight.inference import server as inference
from fastlight.inference.remote import RemotePolicy
from fastlight.inference.server import InferenceServer, Slot, tensor_spec
from fastlight.models.mlp import MLPActorCritic


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
    server.version, server.checksum = 7, 12.5  # as after a sync: the delivery checksum goes with answers
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


class FakeClock:
    """Stands in for ``time`` in the inference module: the tests move ``now`` themselves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def scripted_polls(monkeypatch, server, *, tick_s: float, arrivals=None) -> list[float]:
    """Make ``server.poll(timeout)`` deterministic: each call lets ``min(timeout, tick_s)`` pass on
    a fake clock, then receives what was sent; ``arrivals[k]`` (a sampler's pipe end and message)
    is sent during the ``k``-th call. Returns the list of requested timeouts."""
    clock, polls, poll = FakeClock(), [], server.poll
    monkeypatch.setattr(inference, "time", clock)

    def fake_poll(timeout: float) -> None:
        assert len(polls) < 100, "gather does not stop polling"
        if arrivals and len(polls) in arrivals:
            end, msg = arrivals[len(polls)]
            end.send(msg)
        polls.append(timeout)
        clock.now += min(timeout, tick_s)
        poll(0.0)

    monkeypatch.setattr(server, "poll", fake_poll)
    return polls


def test_max_wait_bounds_the_batching_delay(monkeypatch):
    server, slots, ends, _ = make_server([2, 3], max_batch=64, max_wait_ms=30.0)
    ends[0].send(("act", 2, 0))
    polls = scripted_polls(monkeypatch, server, tick_s=0.01)  # nothing more arrives
    batch = server.gather()
    assert [(r.index, r.rows) for r in batch] == [(0, 2)]
    # It kept waiting for more rows until max_wait_ms had passed, and not a poll longer:
    # timeouts 30, 20, 10 ms on a clock that moves 10 ms per poll.
    assert polls == pytest.approx([0.03, 0.02, 0.01])


def test_requests_arriving_within_max_wait_join_the_batch(monkeypatch):
    server, slots, ends, _ = make_server([2, 3], max_batch=64, max_wait_ms=30.0)
    ends[0].send(("act", 2, 40))
    arrivals = {1: (ends[1], ("act", 3, 5))}  # sampler 1 asks 10 ms into the wait
    polls = scripted_polls(monkeypatch, server, tick_s=0.01, arrivals=arrivals)
    batch = server.gather()
    assert [(r.index, r.rows) for r in batch] == [(1, 3), (0, 2)]  # one batch, the straggler first
    assert polls == pytest.approx([0.03, 0.02, 0.01])  # still below max_batch: waited the window out
    assert server.pending == []


def test_max_batch_ends_the_wait_early(monkeypatch):
    server, slots, ends, _ = make_server([2, 2, 2], max_batch=4, max_wait_ms=30.0)
    ends[0].send(("act", 2, 9))
    arrivals = {0: (ends[1], ("act", 2, 3))}  # max_batch rows 5 ms into the wait
    polls = scripted_polls(monkeypatch, server, tick_s=0.005, arrivals=arrivals)
    batch = server.gather()
    assert [(r.index, r.rows) for r in batch] == [(1, 2), (0, 2)]
    assert polls == pytest.approx([0.03])  # no further poll: the batch was full


def test_served_results_match_the_policy_and_carry_the_version():
    server, slots, ends, policy = make_server([3, 2], max_batch=8, max_wait_ms=1.0)
    obs = [torch.randn(3, 3), torch.randn(2, 3)]
    for i, o in enumerate(obs):
        slots[i].obs[""][: len(o)] = o
        ends[i].send(("value", len(o), 0))
    server.poll(0.1)
    server.serve(server.gather())
    for i, o in enumerate(obs):
        assert ends[i].recv() == (7, 12.5)
        torch.testing.assert_close(slots[i].values[: len(o)], policy.value(o).detach())


def test_remote_policy_round_trip_through_a_thread():
    import threading

    server, slots, ends, policy = make_server([2], max_batch=8, max_wait_ms=1.0)
    remote = RemotePolicy(slots[0], ends[0], policy.action_mapping())

    def serve_once():
        server.poll(1.0)
        server.serve(server.gather())

    t = threading.Thread(target=serve_once)
    t.start()
    o = torch.randn(2, 3)
    v = remote.value(o)
    t.join()
    assert (remote.last_version, remote.last_checksum) == (7, 12.5)
    torch.testing.assert_close(v, policy.value(o).detach())


def test_a_sampler_waiting_on_the_worker_beats(monkeypatch):
    """A sampler waiting for the worker's answer keeps its heartbeat (so a hung worker, not the
    samplers waiting on it, is the silent process the pool names); it stops beating once answered."""
    import threading
    import time

    from fastlight.inference import remote as remote_module

    monkeypatch.setattr(remote_module, "WAIT_BEAT_S", 0.05)
    server, slots, ends, policy = make_server([2], max_batch=8, max_wait_ms=1.0)
    remote = RemotePolicy(slots[0], ends[0], policy.action_mapping())
    beats: list[float] = []
    remote.new_round(lambda: beats.append(time.monotonic()))

    def serve_late():
        time.sleep(0.5)  # a worker busy (or stopped) for 0.5 s
        server.poll(1.0)
        server.serve(server.gather())

    t = threading.Thread(target=serve_late)
    t.start()
    start = time.monotonic()
    remote.value(torch.randn(2, 3))
    answered = time.monotonic()
    t.join()
    assert len(beats) >= 4, beats  # ~10 polls of 0.05 s in 0.5 s; a loaded machine does fewer
    assert all(start <= b <= answered for b in beats)
    assert beats[-1] - beats[0] >= 0.2  # spread over the wait, not one burst
