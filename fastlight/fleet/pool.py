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

Under the forkserver start method (the ``fastlight`` command's), every sampler (and the inference
worker) is a child of the forkserver, and its exit code reaches the trainer through it: when the
forkserver dies, all of them read as dead with exit code 255 at once (and are, killed by their
parent-death signal). That is one fault, named as the forkserver (``the forkserver (pid N) died:
killed by SIGKILL, ...``): a new forkserver is started and all its samplers with it, for one restart
of the budget; every round in flight is dropped and counted.

Nothing is restarted once :meth:`SamplerPool.stop` has begun: a stop waits for a restart under way
(the prefetch thread's) to finish, then stops what it started; no restart begins after it.

Each sampler writes to its own pipe, read by its own thread here, so a sampler killed in the
middle of a send leaves nothing broken for the others; the locks samplers share with the trainer
(weights, task weights) are freed if the killed sampler held them.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import queue
import signal
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as tmp
from torch import nn

from fastlight.fleet.base import Fleet, SamplerFleet
from fastlight.fleet.faults import FLAG, FaultSettings
from fastlight.fleet.restarts import SamplerError, broken_pipe, crashed, signal_name, spend_restart
from fastlight.fleet.start import (
    forkserver_exit_code,
    forkserver_pid,
    pin_fastlight_path,
    restart_forkserver,
)
from fastlight.inference.client import InferenceClient
from fastlight.inference.settings import InferenceSettings
from fastlight.models.base import check_policy
from fastlight.procs import (
    HeartbeatLimits,
    Liveness,
    MemorySample,
    StopFlag,
    alive,
    children_ignore_stop_signals,
    exit_note,
    sample_memory,
)
from fastlight.rollout import Rollout
from fastlight.sampling.cut_requests import CutRequests, rounds_to_cut
from fastlight.sampling.shared_cut import SharedCut
from fastlight.sampling.task_weights import SharedTaskWeights
from fastlight.sampling.worker import SamplerConfig, rollout_from_numpy, sampler_main
from fastlight.weights.publisher import SyncStats, WeightPublisher, WeightSource
from fastlight.weights.shared_memory import SharedWeights

#: How often (seconds) ``next_item`` looks at the samplers' exit codes and heartbeats.
WATCH_EVERY_S = 0.25
#: How long ``stop`` waits for a restart under way (a new forkserver importing, a spawn) to finish.
RESTART_WAIT_S = 30.0


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


class SamplerPool(SamplerFleet):
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
        # spawn, or the forkserver the fastlight command warmed at start-up (fastlight.fleet.start)
        self.ctx = tmp.get_context(start_method)
        self.client: InferenceClient | None = None
        if inference is not None:
            self.client = InferenceClient(
                self.ctx, policy, example_obs, [c.num_envs for c in configs], inference,
                trainer_device=trainer_device,
            )  # fmt: skip
            self.client.liveness.limits = self.heartbeat_limits
        # Serialises a restart (prefetch thread) with a publish and with stop (trainer thread): a stop
        # waits for a restart under way, and none begins once it has.
        self._restart_lock = threading.RLock()
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
        # --data.truncation_scope rank: DPSA's termination rate over all these samplers' clips.
        rank_wide = [c.truncation_scope == "rank" for c in configs]
        if any(rank_wide) and not all(rank_wide):
            raise ValueError("truncation_scope must be the same for every sampler of a rank")
        self.shared_cut = SharedCut(self.ctx, [c.num_envs for c in configs]) if all(rank_wide) else None
        # --data.cut_in_flight: the trainer asks for rounds in flight when a batch completes.
        cutting = [c.cut_in_flight for c in configs]
        if any(cutting) and not all(cutting):
            raise ValueError("cut_in_flight must be the same for every sampler of a rank")
        self.cut_requests = CutRequests(self.ctx, len(configs)) if all(cutting) else None
        self._last_sender: int | None = None  # the sampler whose item next_item handed out last
        # When each sampler's last item arrived (its next round began then) and its usual round
        # length (a running mean of the gaps), for cut_in_flight.
        self._arrived: dict[int, float] = {}
        self._round_s: dict[int, float] = {}
        # Every sampler's reader thread feeds this one queue, (kind, sampler index, payload);
        # bounded, so samplers cannot run ahead.
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
        #: The forkserver the children are forked from (start method ``forkserver``), and its memory.
        self._forkserver: int | None = None
        self._forkserver_memory: MemorySample | None = None

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
        if self.ctx.get_start_method() == "forkserver":
            self._forkserver = forkserver_pid()  # started by the first child's start, if not warmed
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
            args=(
                i,
                cfg,
                policy,
                self.weights,
                send,
                liveness,
                self.stop_event,
                os.getpid(),
                self.task_weights,
                self.shared_cut.view(i) if self.shared_cut is not None else None,
                self.cut_requests.view(i) if self.cut_requests is not None else None,
            ),
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
                self._arrival(index, time.monotonic())
                while not self._closing.is_set():
                    try:
                        self.items.put((kind, index, payload), timeout=0.2)
                        break
                    except queue.Full:
                        continue
        except (EOFError, OSError):  # the sampler exited or was killed
            pass
        finally:
            conn.close()

    def _arrival(self, index: int, now: float) -> None:
        last = self._arrived.get(index)
        if last is not None:
            gap = now - last
            mean = self._round_s.get(index)
            self._round_s[index] = gap if mean is None else 0.7 * mean + 0.3 * gap
        self._arrived[index] = now

    def publish(self, policy: nn.Module, version: int) -> SyncStats:
        """New weights for the samplers through the pool's one publisher.

        With an inference worker, a worker that dies or stops making progress during the publish
        is restarted (within the budget) and the publish is made again, to the new worker.
        """
        if self.client is None:
            return self.publisher.publish(policy, version)
        with self._restart_lock:
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
                    forked = self._forkserver_fault(
                        time.monotonic(), wait_s=1.0 if proc.exitcode == 255 else 0
                    )
                    name, note = (f"{self._worker_name()} {what}", None) if forked is None else forked
                    name += f" (publishing version {version})"
                    if not self._restart_served(name, note, forkserver=forked):
                        raise SamplerError(
                            f"weight sync with the inference worker failed while stopping: {e}"
                        ) from e

    def request_drain(self) -> None:
        """Announce the next ``publish`` (AcceRL §inference drain; a no-op for shared memory)."""
        self.publisher.request_drain()

    def set_task_weights(self, weights: list[float]) -> None:
        """Task-sampling weights for every sampler's envs (shared memory, read before each round)."""
        self.task_weights.set(weights)

    def next_item(self, timeout: float) -> Rollout | None:
        """One sampler item (a Rollout), or None if none arrived within ``timeout``.

        Restarts dead or hung samplers on the way (see the module docstring). Raises
        :class:`SamplerError` naming the worker if a sampler raised, if one failed past the restart
        budget, and if nothing at all arrived for ``timeout_s`` (``--data.faults.worker_timeout_s``).
        """
        self.watch()
        try:
            _, self._last_sender, payload = self.items.get(timeout=timeout)
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

    def cut_in_flight(self, timeout: float) -> list[Rollout]:
        """Ask every sampler but the last item's sender to end its round at its next step and take
        one item from each of them (or what arrives within ``timeout`` seconds; a round that comes
        later goes into the next batch). Which samplers: :func:`rounds_to_cut`; see
        :mod:`fastlight.sampling.cut_requests`."""
        if self.cut_requests is None:
            return []
        asked = rounds_to_cut(
            [s.index for s in self.samplers],
            last_sender=self._last_sender,
            arrived=self._arrived,
            round_s=self._round_s,
            now=time.monotonic(),
        )
        self.cut_requests.request(asked)
        waiting = set(asked)
        out: list[Rollout] = []
        deadline = time.monotonic() + timeout
        while waiting and not self.stop_event.is_set() and (left := deadline - time.monotonic()) > 0:
            self.watch()
            try:
                _, index, payload = self.items.get(timeout=min(left, WATCH_EVERY_S))
            except queue.Empty:
                continue
            self._last_item = time.monotonic()
            waiting.discard(index)  # a round it finished just before the request is its answer too
            out.append(rollout_from_numpy(payload))
        return out

    def watch(self, force: bool = False) -> None:
        """Check the inference worker, and every sampler's traceback, exit code and heartbeat."""
        now = time.monotonic()
        if not force and now - self._last_watch < WATCH_EVERY_S:
            return
        self._last_watch = now
        with self._restart_lock:  # stop() sets the flag first, then waits for a restart under way
            if self.stop_event.is_set():
                return
            if self.client is not None:
                self._watch_served(now)
            else:
                self._watch_samplers(now)

    def _watch_samplers(self, now: float) -> None:
        """The shared-memory path's watch: a dead or silent sampler is restarted alone; a dead
        forkserver, with all the samplers it forked. Call under ``_restart_lock``."""
        forked = self._forkserver_fault(now)
        if forked is not None:
            return self._restart_forked(*forked)
        self._raise_reported()
        for s in list(self.samplers):
            if self.stop_event.is_set():
                return
            code = s.proc.exitcode
            if code is not None:
                s.reader.join(timeout=2.0)  # a dying sampler's last words come before its EOF
                self._raise_reported()
                # 255: what every child of a dead forkserver reads, possibly a moment before it does
                forked = self._forkserver_fault(now, wait_s=1.0) if code == 255 else None
                if forked is not None:
                    return self._restart_forked(*forked)
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
        """The inference path's watch: a dead or silent worker or sampler restarts the group (with
        the forkserver, if it is the one that died). Call under ``_restart_lock``."""
        assert self.client is not None and self.client.proc is not None
        forked = self._forkserver_fault(now)
        if forked is not None:
            self._restart_served(*forked, forkserver=forked)
            return
        # A sampler's own exception (not a pipe broken by a dead peer) would recur: stop on it.
        for i, payload in sorted(self.errors.items()):
            if not broken_pipe(payload):
                raise SamplerError(crashed(i, payload))
        worker = self.client.proc
        codes = [worker.exitcode, *(s.proc.exitcode for s in self.samplers)]
        forked = self._forkserver_fault(now, wait_s=1.0) if 255 in codes else None
        if forked is not None:
            self._restart_served(*forked, forkserver=forked)
            return
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

    def _restart_served(
        self, what: str, note: str | None = None, *, forkserver: tuple[str, str | None] | None = None
    ) -> bool:
        """Restart the inference worker and the rank's samplers (and the forkserver, when
        ``forkserver`` says it died) within the budget, else stop naming the process that failed
        (``what``; ``note``: what its exit code means). False, restarting nothing, once the pool is
        stopping. Call under ``_restart_lock``."""
        assert self.client is not None
        client = self.client
        if not client.restartable:
            raise SamplerError(
                f"{what}; a CUDA inference worker is not restarted (--data.inference.device cpu "
                "restarts it, --data.inference null restarts samplers alone)" + (f"; {note}" if note else "")
            )
        if forkserver is not None:  # their exit codes came from the dead server: make sure they are gone
            _kill_forked([s.proc for s in self.samplers] + [client.proc])
        for s in self.samplers:  # first, so none of them reports the worker's death as its own
            self._kill(s)
        worker = client.proc
        if worker is not None and worker.exitcode is None:  # a silent worker, or a sampler's fault
            client.reap()
            if "inference worker" in what:
                what += f"; killed it (exit code {worker.exitcode})"
        group = f"the inference worker and its {len(self.samplers)} samplers"
        if not self._spend_restart(
            what,
            f"restarting {'the forkserver, ' if forkserver is not None else ''}{group} "
            "(their rounds in flight dropped)",
            note,
        ):
            return False
        self._restart_forkserver_if_dead()
        if self.stop_event.is_set():  # the stop came while the forkserver started: spawn nothing
            return False
        self._worker_memory = None
        client.prepare_restart()
        self.errors.clear()  # broken pipes of the group just replaced
        self.dropped_rollouts += len(self.samplers)
        with children_ignore_stop_signals():
            self.samplers = [self._spawn(i) for i in range(len(self.configs))]
            client.close_sampler_ends()
            client.start(self.stop_event, os.getpid())
        return True

    def _forkserver_fault(self, now: float, wait_s: float = 0.0) -> tuple[str, str | None] | None:
        """The line naming the forkserver and how it died, and what its exit code means, if the
        forkserver this pool's children were forked from is dead; None if it runs (or there is none).

        ``wait_s``: how long to wait for it to read as dead, after a child's exit code 255 (its
        status pipe closes as the server exits, a moment before the kernel reports the exit).
        """
        pid = self._forkserver
        if pid is None:
            return None
        deadline = time.monotonic() + wait_s
        while (code := forkserver_exit_code(pid)) is None and forkserver_pid() == pid:
            if time.monotonic() >= deadline:
                self._forkserver_memory = sample_memory(pid) or self._forkserver_memory
                return None
            time.sleep(0.05)
        if code is None:  # already reaped and replaced (by another pool of this process)
            how = "exited"
        elif code < 0:
            how = f"killed by {signal_name(-code)}"
        else:
            how = f"exited with code {code}"
        procs = [s.proc for s in self.samplers]
        forked = f"the {len(procs)} samplers it forked (pids {', '.join(str(p.pid) for p in procs)})"
        if self.client is not None:
            forked = f"the inference worker (pid {self.client.proc.pid}) and {forked}"
        return (
            f"the forkserver (pid {pid}) died: {how}, and with it {forked}",
            exit_note(code, self._forkserver_memory, now),
        )

    def _restart_forked(self, what: str, note: str | None) -> None:
        """The forkserver died, and every sampler it forked: one fault, one restart of the budget
        for a new forkserver and all the samplers. Call under ``_restart_lock``."""
        _kill_forked([s.proc for s in self.samplers])
        for s in self.samplers:
            self._kill(s)
        n = len(self.samplers)
        if not self._spend_restart(what, f"restarting the forkserver and its {n} samplers "
                                         "(their rounds in flight dropped)", note):  # fmt: skip
            return
        self.dropped_rollouts += n
        self._restart_forkserver_if_dead()
        if self.stop_event.is_set():  # the stop came while the forkserver started: spawn nothing
            return
        with children_ignore_stop_signals():
            self.samplers = [self._spawn(i) for i in range(n)]

    def _restart_forkserver_if_dead(self) -> None:
        """Before a restart spawns: a new forkserver if the one in use died, started with the stop
        signals kept from it (``Process.start`` would start one by itself, without that)."""
        pid = self._forkserver
        if pid is not None and (forkserver_exit_code(pid) is not None or forkserver_pid() != pid):
            self._forkserver = restart_forkserver()
            self._forkserver_memory = None

    def _spend_restart(self, name: str, action: str, note: str | None = None) -> bool:
        """Take one restart from the budget (:func:`spend_restart`); False, taking nothing, once the
        pool is stopping: nothing is restarted then."""
        if self.stop_event.is_set():
            return False
        spend_restart(self.restart_times, max_restarts=self.max_restarts, window_s=self.restart_window_s,
                      name=name, action=action, note=note)  # fmt: skip
        self.restarts += 1
        return True

    def _raise_reported(self) -> None:
        for i, payload in sorted(self.errors.items()):
            raise SamplerError(crashed(i, payload))

    def _fault(self, s: _Sampler, what: str, note: str | None = None) -> None:
        """Restart sampler ``s`` (dead or silent) within the budget, else stop naming it (``note``:
        what its exit code means)."""
        pid = s.proc.pid
        self._kill(s)
        killed = "" if what.startswith("died") else f"; killed it (exit code {s.proc.exitcode})"
        env_id = self.configs[s.index].env_id
        name = f"sampler {s.index} ({s.proc.name}, pid {pid}, env {env_id}) {what}{killed}"
        if not self._spend_restart(name, "restarting it", note):
            return
        self._restart_forkserver_if_dead()
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
        """Stop every sampler: ask, then terminate, then kill. Idempotent. No restart begins once it
        is called; one under way (in the prefetch thread) is waited for, and what it started stopped."""
        self.stop_event.set()
        self._closing.set()  # readers drop what still arrives, so no sampler blocks on a full pipe
        # Bounded: a restart stuck starting its processes must not hang the stop (what it then
        # starts still exits with the trainer, die_with_parent).
        locked = self._restart_lock.acquire(timeout=RESTART_WAIT_S)
        try:
            self._stop(timeout)
        finally:
            if locked:
                self._restart_lock.release()

    def _stop(self, timeout: float) -> None:
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


@dataclass(frozen=True)
class LocalFleet(Fleet):
    """The default ``--data.fleet``: each rank's samplers are processes on the trainer's machine
    (a :class:`SamplerPool`)."""

    shared_memory = True

    def build(
        self,
        configs: list[SamplerConfig],
        policy: nn.Module,
        *,
        rank: int,
        inference: InferenceSettings | None,
        trainer_device: torch.device | str,
        example_obs: Any,
        faults: FaultSettings,
        start_method: str,
    ) -> SamplerPool:
        return SamplerPool(
            configs, policy, inference=inference, trainer_device=trainer_device, example_obs=example_obs,
            faults=faults, start_method=start_method,
        )  # fmt: skip


def _stop_ref(ref: weakref.ref) -> None:
    pool = ref()
    if pool is not None:
        pool.stop()


def _kill_forked(procs: list[Any]) -> None:
    """SIGKILL the processes of a dead forkserver that still run. Their exit code (255) came from the
    server's closed status pipe, not from them, so ``Process.kill`` would skip them; their
    parent-death signal has normally killed them already."""
    for proc in procs:
        if proc is not None and proc.pid is not None and alive(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
