"""Which rank of a multi-rank run is lost, and a process-group timeout that notices.

A killed, stopped or hung rank leaves the others in their next collective, whose error does not say
which rank it was. :class:`PeerWatch` gives every rank a heartbeat and a progress counter in the
rendezvous store torch.distributed already has (the ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``), beaten
by a thread through its own short-timeout connection, so a store host that stops answering is noticed
too. After a collective fails, the survivors read who stopped beating, whose launcher saw it exit, or,
when every heartbeat is alive, whose progress stopped (hung in Python).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta

import torch.distributed as dist

#: Default of ``LostRankCheckpoint(peer_timeout_minutes=...)``: longer than any checkpoint write
#: the others wait for in Lightning's barrier, far shorter than Lightning's 30 minutes.
DEFAULT_PEER_TIMEOUT_MINUTES = 5.0

#: Heartbeats a peer may miss, after a collective failed, before it counts as lost.
MISSED_BEATS = 3


def set_process_group_timeout(seconds: float) -> None:
    """The default process group's collective timeout (gloo; NCCL with ``TORCH_NCCL_BLOCKING_WAIT=1``),
    through torch's private ``_set_pg_timeout``: there is no public setter for a group already up."""
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(timedelta(seconds=seconds))


_reported: list[str] = []


def report_loss(line: str) -> None:
    """Note that this process printed the line of a stop after a lost rank (the command exits 1)."""
    _reported.append(line)


def reported_loss() -> str | None:
    return _reported[-1] if _reported else None


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited {code}"


class PeerWatch:
    """Heartbeats of every rank through the rendezvous store, read by a daemon thread.

    Args:
        rank, world_size: this process's place in the default process group.
        timeout_s: the peer timeout; the heartbeat interval is a tenth of it, between 0.5 and 5 s.
        launched: the ranks this process started (the global ranks after this one, in order), whose
            exit is known at once.
        address: the store's ``(host, port)``; ``MASTER_ADDR`` / ``MASTER_PORT`` by default.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        timeout_s: float,
        launched: Sequence[subprocess.Popen] = (),
        address: tuple[str, int] | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"PeerWatch timeout_s must be > 0, got {timeout_s}")
        self.rank, self.world_size, self.timeout_s = rank, world_size, float(timeout_s)
        self.interval_s = min(5.0, max(0.5, self.timeout_s / 10))
        self.launched = list(launched)
        if address is None:
            host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT", "29500")
            address = (host, int(port))
        self.address = address
        # Keys of this launch only: torchrun's agent keeps its store across elastic restarts.
        self._prefix = f"fastlight/peers/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self.peers = [r for r in range(world_size) if r != rank]
        self._lock = threading.Lock()
        start = time.monotonic()
        self._beats = dict.fromkeys(self.peers, -1)
        self._seen = dict.fromkeys(self.peers, start)  # when each peer's beat last changed
        self._steps = dict.fromkeys(range(world_size), 0)
        self._exited: dict[int, int] = {}
        self._store_down_since: float | None = None
        self._store_error = ""
        self._progress, self._published = 0, 0
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: dist.Store | None = None

    # ------------------------------------------------------------------ the thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="fastlight-peer-watch")
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.interval_s + 1.0)

    def note_progress(self, step: int) -> None:
        """This rank completed the update that ends at global step ``step`` (published at the next beat)."""
        self._progress = int(step)

    def _connect(self) -> dist.Store:
        host, port = self.address
        timeout = timedelta(seconds=2 * self.interval_s)
        store = dist.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
        return dist.PrefixStore(self._prefix, store)

    def _run(self) -> None:
        while True:
            self._beat()
            if self._closed.wait(self.interval_s):
                return

    def _poll_launched(self) -> None:
        for i, proc in enumerate(self.launched):
            if (code := proc.poll()) not in (None, 0):
                with self._lock:
                    # The launcher runs on a node's first rank and starts the node's next ones in order.
                    self._exited.setdefault(self.rank + i + 1, int(code))

    def _beat(self) -> None:
        now = time.monotonic()
        self._poll_launched()
        try:
            if self._store is None:
                self._store = self._connect()
            store = self._store
            store.add(f"beat/{self.rank}", 1)
            progress = self._progress
            if progress != self._published:
                store.add(f"step/{self.rank}", progress - self._published)
                self._published = progress
            beats = {k: int(store.add(f"beat/{k}", 0)) for k in self.peers}
            steps = {k: int(store.add(f"step/{k}", 0)) for k in self.peers}
        except Exception as e:  # noqa: BLE001 - DistStoreError, a timeout, a refused connection: all "down"
            self._store = None
            with self._lock:
                if self._store_down_since is None:
                    self._store_down_since, self._store_error = now, str(e).splitlines()[0][:160]
            return
        with self._lock:
            self._store_down_since = None
            for k, v in beats.items():
                if v != self._beats[k]:
                    self._beats[k], self._seen[k] = v, now
            self._steps.update(steps)
            self._steps[self.rank] = progress

    # ------------------------------------------------------------------ the verdict
    def lost(self, stale_s: float | None = None) -> dict[int, str]:
        """The ranks lost now, each with why: exited (a launched rank), no heartbeat for ``stale_s``
        (default: :data:`MISSED_BEATS` intervals), or the store's host unreachable that long."""
        stale = MISSED_BEATS * self.interval_s if stale_s is None else stale_s
        self._poll_launched()
        now = time.monotonic()
        with self._lock:
            out = {k: describe_exit(code) for k, code in self._exited.items()}
            down = self._store_down_since
            if down is not None and now - down >= stale:
                host, port = self.address
                ago = f"{now - down:.0f} s ago ({self._store_error})"
                out.setdefault(
                    0,
                    f"is unreachable: the rendezvous store it hosts at {host}:{port} stopped answering {ago}",
                )
            elif down is None:
                silent = {k: now - self._seen[k] for k in self.peers if k not in out}
                out |= {
                    k: f"stopped sending heartbeats {s:.0f} s ago (killed, stopped, or its node is gone)"
                    for k, s in silent.items()
                    if s >= stale
                }
        return dict(sorted(out.items()))

    def wait_for_loss(self) -> dict[int, str]:
        """After a collective failed: the ranks lost, waiting up to :data:`MISSED_BEATS` + 2 intervals."""
        deadline = time.monotonic() + (MISSED_BEATS + 2) * self.interval_s
        while not (lost := self.lost()) and time.monotonic() < deadline:
            time.sleep(min(0.2, self.interval_s / 4))
        return lost

    def behind(self) -> dict[int, str]:
        """Ranks alive but behind the others' progress (hung in Python with a live heartbeat thread)."""
        with self._lock:
            steps = dict(self._steps)
        top = max(steps.values())
        stuck = "is alive but stuck after global step {} (the others reached {})"
        return {k: stuck.format(s, top) for k, s in sorted(steps.items()) if s < top}

    def writer(self, lost: Mapping[int, str]) -> int | None:
        """The rank that writes the survivors' checkpoint: the lowest one not lost."""
        alive = [r for r in range(self.world_size) if r not in lost]
        return alive[0] if alive else None
