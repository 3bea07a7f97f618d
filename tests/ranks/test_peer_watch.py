"""PeerWatch against a real torch.distributed TCPStore (the rendezvous store a run already has): the
verdict on a rank that stops beating, on a store host that stops answering, on a launched rank that
exited, on a rank that is alive but behind; and which processes count as launched ranks."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from fastlight.ranks import launcher, peer_watch
from fastlight.ranks.peer_watch import PeerWatch


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store_address():
    port = free_port()
    master = dist.TCPStore(
        "127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False
    )
    yield master, ("127.0.0.1", port)
    del master


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_rank_that_stops_beating_is_lost_after_the_missed_beats(store_address):
    _, address = store_address
    watches = [PeerWatch(rank=r, world_size=3, timeout_s=5.0, address=address) for r in range(3)]
    assert watches[0].interval_s == 0.5  # a tenth of the timeout, at least 0.5 s
    for w in watches:
        w.start()
    try:
        time.sleep(1.2)
        assert [w.lost() for w in watches] == [{}, {}, {}]  # all beating
        watches[2].close()  # rank 2 stops beating (as a SIGKILLed or SIGSTOPped rank does)
        t0 = time.monotonic()
        lost = watches[0].wait_for_loss()
        waited = time.monotonic() - t0
        assert list(lost) == [2], lost
        assert lost[2].startswith("stopped sending heartbeats ") and lost[2].endswith(
            " s ago (killed, stopped, or its node is gone)"
        )
        # Three missed beats (1.5 s) after its last one, not the 5 s timeout.
        assert 0.5 < waited < peer_watch.MISSED_BEATS * 0.5 + 1.5, waited
        assert watches[1].wait_for_loss().keys() == {2}
        assert watches[0].writer(lost) == 0
        assert watches[0].writer({0: "x"}) == 1 and watches[0].writer({0: "x", 1: "y", 2: "z"}) is None
    finally:
        for w in watches:
            w.close()


def test_store_host_gone_names_rank_0():
    port = free_port()
    master = dist.TCPStore(
        "127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False
    )
    w = PeerWatch(rank=1, world_size=2, timeout_s=5.0, address=("127.0.0.1", port))
    w.start()
    try:
        wait_until(lambda: w._beats[0] == 0)  # connected, rank 0's key read (it never beats here)
        del master  # the process hosting the store is gone
        lost = w.wait_for_loss()
        assert list(lost) == [0], lost
        assert lost[0].startswith(
            f"is unreachable: the rendezvous store it hosts at 127.0.0.1:{port} stopped "
        )
    finally:
        w.close()


def test_a_launched_rank_that_exited_is_lost_at_once(store_address):
    _, address = store_address
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    )
    child.wait(timeout=30)
    launched = {0: [child], 1: []}
    peers = [
        PeerWatch(rank=r, world_size=2, timeout_s=60.0, launched=launched[r], address=address)
        for r in range(2)
    ]
    for w in peers:
        w.start()
    try:
        t0 = time.monotonic()
        assert peers[0].wait_for_loss() == {1: f"was killed by {signal.SIGKILL.name}"}
        assert time.monotonic() - t0 < 1.0  # no heartbeats to miss: the launcher saw it exit
    finally:
        for w in peers:
            w.close()


def test_alive_but_behind_is_named_with_its_step(store_address):
    _, address = store_address
    peers = [PeerWatch(rank=r, world_size=2, timeout_s=5.0, address=address) for r in range(2)]
    for w in peers:
        w.start()
    try:
        peers[0].note_progress(12)
        peers[1].note_progress(10)
        wait_until(lambda: peers[0]._steps == {0: 12, 1: 10} and peers[1]._steps == {0: 12, 1: 10})
        assert peers[0].behind() == {1: "is alive but stuck after global step 10 (the others reached 12)"}
        assert peers[1].behind() == peers[0].behind()
        assert peers[0].lost() == {}
    finally:
        for w in peers:
            w.close()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0"}, True),  # torchrun's agent started it
        ({"LOCAL_RANK": "1"}, True),  # Lightning's launcher started it
        ({"LOCAL_RANK": "0"}, False),  # the process a person (or a scheduler) started
        ({}, False),
        ({"LOCAL_RANK": "1", "SLURM_JOB_ID": "7"}, False),  # srun starts every task
        ({"LOCAL_RANK": "x"}, False),
    ],
)
def test_launched_rank(env, expected):
    assert launcher.launched_rank(env) is expected


def test_bad_timeout_is_refused():
    with pytest.raises(ValueError, match="PeerWatch timeout_s must be > 0, got 0"):
        PeerWatch(rank=0, world_size=2, timeout_s=0)
