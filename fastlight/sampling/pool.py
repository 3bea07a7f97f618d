"""``SamplerPool``: the trainer-side handle on a rank's sampler processes.

It spawns them, publishes weights, hands out their Rollouts one item at a time (the
DataModule's prefetcher assembles super-batches), and stops them. A sampler that raises sends
its traceback, which is re-raised here naming the worker. Nothing waits forever: ``next_item``
gives up after ``timeout_s`` without data.

Restarts (Sample Factory's habit): a sampler that dies without a word (a signal, a segfault, the
OOM killer) or that makes no progress for ``heartbeat_s`` (SIGSTOP, an env hanging in ``step``) is
killed and started again with the same config, on the current weights; the round it was sampling
is lost and counted (``dropped_rollouts``). At most ``max_restarts`` restarts per
``restart_window_s`` seconds; one more stops the run with a :class:`SamplerError` naming the
sampler, its pid, its exit code and the env id. A Python exception in a sampler is not restarted:
it carries its own message (a non-finite value, a bug in an env) and would recur.

With an inference worker, the worker and the rank's samplers fail together (a dead worker's
samplers lose their pipe; a dead sampler's EOF ends the worker's serving loop), so any of them dead
or silent (the worker has a heartbeat too) restarts the group: the samplers are killed, the worker
is reaped and started again on fresh pipes, attached to the same shared-memory weights (the
current version, taken before it serves), and the samplers are spawned on the new pipes. It costs
one restart of the budget; every sampler's round in flight is dropped and counted. Only a CPU
worker (shared-memory weights) is restarted; a CUDA worker's failure stops the run, named.

Each sampler writes to its own pipe, read by its own thread here, so a sampler killed in the
middle of a send leaves nothing broken for the others; the locks samplers share with the trainer
(weights, task weights) are freed if the killed sampler held them.
"""

from __future__ import annotations

import atexit
import collections
import os
import queue
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as tmp
from torch import nn

from fastlight.inference.client import InferenceClient
from fastlight.inference.settings import InferenceSettings
from fastlight.models.base import check_policy
from fastlight.procs import (
    HeartbeatLimits,
    Liveness,
    MemorySample,
    StopFlag,
    children_ignore_stop_signals,
    exit_note,
    sample_memory,
)
from fastlight.rollout import Rollout
from fastlight.sampling.faults import FLAG, FaultSettings
from fastlight.sampling.start import pin_fastlight_path
from fastlight.sampling.task_weights import SharedTaskWeights
from fastlight.sampling.worker import SamplerConfig, rollout_from_numpy, sampler_main
from fastlight.weights.publisher import SyncStats, WeightPublisher, WeightSource
from fastlight.weights.shared_memory import SharedWeights

#: How often (seconds) ``next_item`` looks at the samplers' exit codes and heartbeats.
WATCH_EVERY_S = 0.25

class SamplerError(RuntimeError):
    """A sampler process failed; the message names it and carries its traceback."""


@dataclass
class _Sampler:
    """One running sampler process and what the pool watches of it."""

    index: int
    proc: Any
    liveness: Liveness  # the heartbeat the sampler beats on progress
    reader: threading.Thread
    #: Its resident memory at the last watch: what an OOM-killed sampler held (its exit code is all
    #: the kernel leaves, and a dead process's /proc entry is gone).
    memory: MemorySample | None = None


class SamplerPool:
    """Sampler processes of one trainer rank, each with a policy copy - or, with ``inference``
    (:class:`~fastlight.inference.InferenceSettings`), all served by one inference worker on
    ``inference.device`` (``None``: ``trainer_device``; ``example_obs`` gives the observation layout).

    ``faults`` (:class:`~fastlight.sampling.FaultSettings`): ``max_worker_restarts`` per
    ``restart_window_s`` bounds the restarts of dead or silent samplers; ``heartbeat_s`` is how
    long a started sampler may make no progress (no env step, reset or wait loop) before it counts
    as hung. Until its first beat (spawn, imports, building the envs) a sampler gets
    ``worker_timeout_s``, which is also how long ``next_item`` waits for data.
    """

    def __init__(
        self,
        configs: list[SamplerConfig],
        policy: nn.Module,
        *,
        inference: InferenceSettings | None = None,
        trainer_device: torch.device | str = "cpu",
        example_obs: Any = None,
        faults: FaultSettings | None = None,
        start_method: str = "spawn",
    ) -> None:
        check_policy(policy)  # a missing action_mapping must fail here, not in a child process
        self.configs = configs
        self.policy = policy
        self.faults = faults = faults or FaultSettings()
        self.timeout_s = timeout_s = faults.worker_timeout_s
        self.max_restarts, self.restart_window_s = faults.max_worker_restarts, faults.restart_window_s
        self.heartbeat_s = heartbeat_s = faults.heartbeat_s
        # Samplers and the inference worker alike; until its first beat a process gets worker_timeout_s.
        self.heartbeat_limits = HeartbeatLimits(
            heartbeat_s, timeout_s, f"{FLAG}.heartbeat_s", start_flag=f"{FLAG}.worker_timeout_s"
        )
        # spawn, or the forkserver the fastlight command warmed at start-up (fastlight.sampling.start)
        self.ctx = tmp.get_context(start_method)
        self.client: InferenceClient | None = None
        if inference is not None:
            self.client = InferenceClient(
                self.ctx, policy, example_obs, [c.num_envs for c in configs], inference,
                trainer_device=trainer_device,
            )  # fmt: skip
            self.client.liveness.limits = self.heartbeat_limits
        # Serialises a restart of the served group (prefetch thread) with a publish (trainer thread).
        self._served_lock = threading.RLock()
        # One publisher (trainer end) and what the samplers read (their end) for either path.
        self.publisher: WeightPublisher
        self.weights: WeightSource
        self.shared: SharedWeights | None = None
        if self.client is None:
            self.shared = SharedWeights(policy, self.ctx)
            self.publisher, self.weights = self.shared, self.shared
        else:
            self.publisher, self.weights = self.client, self.client.weights_source()
        self.task_weights = SharedTaskWeights(self.ctx)
        # Every sampler's reader thread feeds this one queue; bounded, so samplers cannot run ahead.
        self.items: queue.Queue[tuple[str, int, Any]] = queue.Queue(maxsize=2 * len(configs))
        self.stop_event = StopFlag(self.ctx)
        self.samplers: list[_Sampler] = []
        self.errors: dict[int, str] = {}  # tracebacks the samplers sent, by index
        self.restart_times: collections.deque[float] = collections.deque()
        self.restarts = 0  # faults/worker_restarts
        self.dropped_rollouts = 0  # faults/dropped_rollouts: rounds lost with a restarted sampler
        self._closing = threading.Event()
        self._last_item = time.monotonic()
        self._last_watch = 0.0
        self._worker_memory: MemorySample | None = None  # the inference worker's, as for a sampler

    @property
    def num_workers(self) -> int:
        return len(self.configs)

    @property
    def procs(self) -> list:
        """The live sampler processes, by index."""
        return [s.proc for s in self.samplers]

    def start(self) -> None:
        # Children import fastlight from sys.path: the working directory cli_main puts first may hold
        # another fastlight/ than the one running here (spawn, and restarts, read sys.path then).
        pin_fastlight_path()
        with children_ignore_stop_signals():  # stop signals are the trainer's to handle
            self.samplers = [self._spawn(i) for i in range(len(self.configs))]
            if self.client is not None:
                self.client.close_sampler_ends()
                self.client.start(self.stop_event, os.getpid())
        self._last_item = time.monotonic()
        # Last line of defence if the trainer exits without teardown.
        atexit.register(_stop_ref, weakref.ref(self))

    def _spawn(self, i: int) -> _Sampler:
        cfg = self.configs[i]
        policy = self.policy if self.client is None else self.client.remote_policy(i, self.policy)
        receive, send = self.ctx.Pipe(duplex=False)
        liveness = Liveness(self.ctx, self.heartbeat_limits)
        p = self.ctx.Process(
            target=sampler_main,
            args=(i, cfg, policy, self.weights, send, liveness, self.stop_event, os.getpid(),
                  self.task_weights),
            name=f"fastlight-sampler-{i}",
            daemon=True,
        )
        p.start()
        # Only the sampler holds the write end now: when it dies, the reader sees EOF, even in
        # the middle of a message.
        send.close()
        reader = threading.Thread(
            target=self._read, args=(i, receive), daemon=True, name=f"fastlight-sampler-{i}-reader"
        )
        reader.start()
        liveness.reset()
        return _Sampler(i, p, liveness, reader)

    def _read(self, index: int, conn: Any) -> None:
        """Sampler ``index``'s messages into ``self.items`` (tracebacks into ``self.errors``)."""
        try:
            while True:
                kind, tag, payload = conn.recv()
                if kind == "error":
                    self.errors[index] = payload
                    return
                while not self._closing.is_set():
                    try:
                        self.items.put((kind, tag, payload), timeout=0.2)
                        break
                    except queue.Full:
                        continue
        except (EOFError, OSError):  # the sampler exited or was killed
            pass
        finally:
            conn.close()

    def publish(self, policy: nn.Module, version: int) -> SyncStats:
        """New weights for the samplers through the pool's one publisher.

        With an inference worker, a worker that dies or stops making progress during the publish
        is restarted (within the budget) and the publish is made again, to the new worker.
        """
        if self.client is None:
            return self.publisher.publish(policy, version)
        with self._served_lock:
            while True:
                try:
                    return self.publisher.publish(policy, version)
                except Exception as e:
                    proc = self.client.proc
                    hung = self.client.hang()
                    healthy = proc is not None and proc.exitcode is None and hung is None
                    if proc is None or healthy or not self.client.restartable:
                        raise SamplerError(f"weight sync with the inference worker failed: {e}") from e
                    what = f"died with exit code {proc.exitcode}" if proc.exitcode is not None else hung
                    self._restart_served(f"{self._worker_name()} {what} (publishing version {version})")

    def request_drain(self) -> None:
        """Announce the next ``publish`` (AcceRL §inference drain; a no-op for shared memory)."""
        self.publisher.request_drain()

    def next_item(self, timeout: float) -> Rollout | None:
        """One sampler item (a Rollout), or None if none arrived within ``timeout``.

        Restarts dead or hung samplers on the way (see the module docstring). Raises
        :class:`SamplerError` naming the worker if a sampler raised, if one failed past the restart
        budget, and if nothing at all arrived for ``timeout_s`` (``--data.faults.worker_timeout_s``).
        """
        self.watch()
        try:
            _, _, payload = self.items.get(timeout=timeout)
        except queue.Empty:
            self.watch(force=True)
            if time.monotonic() - self._last_item > self.timeout_s:
                raise SamplerError(
                    f"no rollout from the samplers for {self.timeout_s:.0f} s "
                    "(--data.faults.worker_timeout_s); "
                    f"alive: {[p.is_alive() for p in self.procs]}"
                ) from None
            return None
        self._last_item = time.monotonic()
        return rollout_from_numpy(payload)

    def watch(self, force: bool = False) -> None:
        """Check the inference worker, and every sampler's traceback, exit code and heartbeat."""
        now = time.monotonic()
        if not force and now - self._last_watch < WATCH_EVERY_S:
            return
        self._last_watch = now
        if self.client is not None:
            with self._served_lock:
                if not self.stop_event.is_set():
                    self._watch_served(now)
            return
        self._raise_reported()
        for s in list(self.samplers):
            if self.stop_event.is_set():
                return
            code = s.proc.exitcode
            if code is not None:
                s.reader.join(timeout=2.0)  # a dying sampler's last words come before its EOF
                self._raise_reported()
                self._fault(s, f"died with exit code {code}", exit_note(code, s.memory, now))
                continue
            s.memory = sample_memory(s.proc.pid) or s.memory
            # Until the first beat the sampler is starting (imports, envs): timeout_s applies.
            hung = s.liveness.hang(now)
            if hung is not None:
                self._fault(s, hung)

    def _worker_name(self) -> str:
        assert self.client is not None and self.client.proc is not None
        proc, env_ids = self.client.proc, sorted({c.env_id for c in self.configs})
        return f"inference worker ({proc.name}, pid {proc.pid}, env {', '.join(env_ids)})"

    def _watch_served(self, now: float) -> None:
        """The inference path's watch: a dead or silent worker or sampler restarts the group."""
        assert self.client is not None and self.client.proc is not None
        # A sampler's own exception (not a pipe broken by a dead peer) would recur: stop on it.
        for i, payload in sorted(self.errors.items()):
            if not _broken_pipe(payload):
                raise SamplerError(_crashed(i, payload))
        worker = self.client.proc
        if worker.exitcode is not None:
            note = exit_note(worker.exitcode, self._worker_memory, now)
            return self._restart_served(f"{self._worker_name()} died with exit code {worker.exitcode}", note)
        self._worker_memory = sample_memory(worker.pid) or self._worker_memory
        for s in self.samplers:
            name = f"sampler {s.index} ({s.proc.name}, pid {s.proc.pid}, env {self.configs[s.index].env_id})"
            if s.proc.exitcode is not None:
                note = exit_note(s.proc.exitcode, s.memory, now)
                return self._restart_served(f"{name} died with exit code {s.proc.exitcode}", note)
            s.memory = sample_memory(s.proc.pid) or s.memory
            hung = s.liveness.hang(now)
            if hung is not None:
                return self._restart_served(f"{name} {hung}")
        hung = self.client.hang()
        if hung is not None:
            self._restart_served(f"{self._worker_name()} {hung}")

    def _restart_served(self, what: str, note: str | None = None) -> None:
        """Restart the inference worker and the rank's samplers within the budget, else stop
        naming the process that failed (``what``; ``note``: what its exit code means). Call under
        ``_served_lock``."""
        assert self.client is not None
        client = self.client
        if not client.restartable:
            raise SamplerError(
                f"{what}; a CUDA inference worker is not restarted (--data.inference.device cpu "
                "restarts it, --data.inference null restarts samplers alone)" + (f"; {note}" if note else "")
            )
        for s in self.samplers:  # first, so none of them reports the worker's death as its own
            self._kill(s)
        worker = client.proc
        if worker is not None and worker.exitcode is None:  # a silent worker, or a sampler's fault
            client.reap()
            if "inference worker" in what:
                what += f"; killed it (exit code {worker.exitcode})"
        self._spend_restart(
            what,
            f"restarting the inference worker and its {len(self.samplers)} samplers "
            "(their rounds in flight dropped)",
            note,
        )
        self._worker_memory = None
        client.prepare_restart()
        self.errors.clear()  # broken pipes of the group just replaced
        self.dropped_rollouts += len(self.samplers)
        with children_ignore_stop_signals():
            self.samplers = [self._spawn(i) for i in range(len(self.configs))]
            client.close_sampler_ends()
            client.start(self.stop_event, os.getpid())

    def _spend_restart(self, name: str, action: str, note: str | None = None) -> None:
        """Take one restart from the budget (``--data.faults.max_worker_restarts`` per window) and say
        what is restarted; raises :class:`SamplerError` naming ``name`` once it is spent. ``note``
        (what a signal exit code means) ends the line."""
        tail = f"; {note}" if note else ""
        now = time.monotonic()
        while self.restart_times and now - self.restart_times[0] > self.restart_window_s:
            self.restart_times.popleft()
        budget = (
            f"--data.faults.max_worker_restarts {self.max_restarts} per "
            f"--data.faults.restart_window_s {self.restart_window_s:g}"
        )
        if len(self.restart_times) >= self.max_restarts:
            raise SamplerError(
                f"{name}; restart budget exhausted: {len(self.restart_times)} restarts in the last "
                f"{self.restart_window_s:g} s ({budget}){tail}"
            )
        self.restart_times.append(now)
        self.restarts += 1
        print(
            f"fastlight: {name}; {action} ({len(self.restart_times)} of {self.max_restarts} "
            f"restarts in {self.restart_window_s:g} s){tail}",
            file=sys.stderr,
            flush=True,
        )

    def _raise_reported(self) -> None:
        for i, payload in sorted(self.errors.items()):
            raise SamplerError(_crashed(i, payload))

    def _fault(self, s: _Sampler, what: str, note: str | None = None) -> None:
        """Restart sampler ``s`` (dead or silent) within the budget, else stop naming it (``note``:
        what its exit code means)."""
        pid = s.proc.pid
        self._kill(s)
        killed = "" if what.startswith("died") else f"; killed it (exit code {s.proc.exitcode})"
        env_id = self.configs[s.index].env_id
        name = f"sampler {s.index} ({s.proc.name}, pid {pid}, env {env_id}) {what}{killed}"
        self._spend_restart(name, "restarting it", note)
        self.dropped_rollouts += 1  # the round it was sampling
        with children_ignore_stop_signals():
            self.samplers[s.index] = self._spawn(s.index)

    def _kill(self, s: _Sampler) -> None:
        """SIGKILL (works on a SIGSTOPped process too), reap, free the locks it may have held."""
        if s.proc.exitcode is None:
            s.proc.kill()
        s.proc.join(timeout=5.0)
        s.reader.join(timeout=2.0)
        if self.shared is not None:
            self.shared.release_if_held_by(s.proc.pid)
        self.task_weights.release_if_held_by(s.proc.pid)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every sampler: ask, then terminate, then kill. Idempotent."""
        self.stop_event.set()
        self._closing.set()  # readers drop what still arrives, so no sampler blocks on a full pipe
        deadline = time.monotonic() + timeout
        for s in self.samplers:
            while s.proc.is_alive() and time.monotonic() < deadline:
                self._drain()
                s.proc.join(timeout=0.05)
        for s in self.samplers:
            if s.proc.is_alive():
                s.proc.terminate()
                s.proc.join(timeout=2.0)
            if s.proc.is_alive():
                s.proc.kill()
                s.proc.join(timeout=2.0)
        for s in self.samplers:
            s.reader.join(timeout=1.0)
        self.samplers = []
        if self.client is not None:
            self.client.stop()
        self._drain()

    def _drain(self) -> None:
        try:
            while True:
                self.items.get_nowait()
        except queue.Empty:
            pass


def _stop_ref(ref: weakref.ref) -> None:
    pool = ref()
    if pool is not None:
        pool.stop()


def _crashed(index: int, payload: str) -> str:
    """Sampler ``index``'s own exception: its last line (e.g. which env raised, of which seed, at which
    step) on the first line, then the traceback it sent."""
    lines = [line for line in payload.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "no traceback"
    kind, sep, message = last.partition(": ")
    if sep and " " not in kind:  # "fastlight.sampling.collector.EnvError: ..." -> "EnvError: ..."
        last = f"{kind.rsplit('.', 1)[-1]}: {message}"
    return f"sampler worker {index} (fastlight-sampler-{index}) crashed: {last}\n{payload}"


def _broken_pipe(payload: str) -> bool:
    """Whether a sampler's traceback is its pipe to the inference worker breaking (the worker died,
    or ended its loop on another sampler's EOF): a consequence of a fault, not a fault of its own."""
    return any(e in payload for e in ("EOFError", "ConnectionResetError", "BrokenPipeError"))
