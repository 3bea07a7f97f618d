"""``SamplerPool``: the trainer-side handle on a rank's sampler processes.

Restarts (Sample Factory's habit): a sampler that dies without a word (a signal, the OOM killer) or
makes no progress for ``heartbeat_s`` is killed and started again on the current weights; its round
is dropped and counted. A Python exception in a sampler is not restarted: it would recur. The
budget, watch cadence and stop are every fleet's (:class:`~fastlight.fleet.base.SamplerFleet`).

With ``--data.inference``, the worker and the rank's samplers fail together (a dead worker's samplers
lose their pipe; a dead sampler's EOF ends the worker's serving loop), so any of them dead or silent
restarts the group, for one restart of the budget: the worker starts again on fresh pipes, attached
to the same shared-memory weights. Only a worker on the double buffer is restarted.

Each sampler writes to its own pipe, read by its own thread here, so a sampler killed mid-send breaks
nothing for the others; the locks it shared with the trainer are freed.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch.multiprocessing as tmp
from torch import nn

from fastlight.fleet.base import WATCH_EVERY_S, Fleet, FleetBuild, SamplerFleet
from fastlight.fleet.faults import SamplerError, broken_pipe, crashed, env_raised
from fastlight.fleet.local_watch import FORKSERVER_EXIT_S, check_forkserver, process_fault
from fastlight.fleet.start import forkserver_pid
from fastlight.inference.client import InferenceClient
from fastlight.procs import Liveness, MemorySample, StopFlag, children_ignore_stop_signals
from fastlight.rollout import Rollout
from fastlight.sampling.bundle import RankHandles
from fastlight.sampling.round_signal import rounds_to_cut
from fastlight.sampling.worker import rollout_from_numpy, sampler_main
from fastlight.weights.publisher import SyncStats, WeightPublisher, WeightSource
from fastlight.weights.shared_memory import SharedWeights

#: How long ``stop`` waits for the samplers to end their rounds before it terminates them.
STOP_WAIT_S = 5.0


@dataclass
class _Sampler:
    """One running sampler process (a :class:`~fastlight.fleet.local_watch.Watched`)."""

    index: int
    proc: Any
    liveness: Liveness  # the heartbeat the sampler beats on progress
    reader: threading.Thread
    #: Its resident memory at the last watch: what an OOM-killed sampler held.
    memory: MemorySample | None = None


class SamplerPool(SamplerFleet):
    """Sampler processes of one trainer rank (:class:`~fastlight.fleet.base.FleetBuild`), each with a
    policy copy - or, with ``inference``, all served by one inference worker; watched and restarted
    as ``faults`` (:class:`~fastlight.fleet.FaultSettings`) say."""

    def __init__(self, build: FleetBuild) -> None:
        super().__init__(build)
        policy, configs = self.policy, self.configs
        # spawn, or the forkserver the fastlight command warmed at start-up (fastlight.fleet.start)
        self.ctx = tmp.get_context(build.start_method)
        self.client: InferenceClient | None = None
        if build.inference is not None:
            self.client = InferenceClient(
                self.ctx, policy, build.example_obs, [c.num_envs for c in configs], build.inference,
                trainer_device=build.trainer_device,
            )  # fmt: skip
            self.client.liveness.limits = self.heartbeat_limits  # the samplers' limits (base class)
        # One publisher (trainer end) and what the samplers read (their end) for either path.
        self.shared = SharedWeights(policy, self.ctx) if self.client is None else None
        self.publisher: WeightPublisher = self.shared or self.client  # type: ignore[assignment]
        self.weights: WeightSource = self.shared or self.client.weights_source()  # type: ignore[union-attr]
        # What the samplers share with the trainer and each other: task weights, the round signal.
        self.handles = RankHandles(self.ctx, configs)
        self.task_weights = self.handles.task_weights
        self._last_sender: int | None = None  # the sampler whose item next_item handed out last
        # When each sampler's last item arrived and its usual round length, for cut_in_flight.
        self._arrived: dict[int, float] = {}
        self._round_s: dict[int, float] = {}
        # (kind, sampler index, payload) from every reader thread; bounded, so samplers cannot run ahead.
        self.items: queue.Queue[tuple[str, int, Any]] = queue.Queue(maxsize=2 * len(configs))
        self.stop_event = StopFlag(self.ctx)
        self.samplers: list[_Sampler] = []
        self.errors: dict[int, str] = {}  # tracebacks the samplers sent, by index
        #: The forkserver the children are forked from (start method ``forkserver``).
        self._forkserver: int | None = None

    @property
    def procs(self) -> list:
        """The live sampler processes, by index."""
        return [s.proc for s in self.samplers]

    def _start(self) -> None:
        self._spawn_all()
        if self.ctx.get_start_method() == "forkserver":
            self._forkserver = forkserver_pid()  # started by the first child's start, if not warmed

    def _spawn_all(self) -> None:
        """Every sampler, and the inference worker that serves them."""
        with children_ignore_stop_signals():  # stop signals are the trainer's to handle
            self.samplers = [self._spawn(i) for i in range(len(self.configs))]
            if self.client is not None:
                self.client.close_sampler_ends()
                self.client.start(self.stop_event, os.getpid())

    def _spawn(self, i: int) -> _Sampler:
        cfg = self.configs[i]
        policy = self.policy if self.client is None else self.client.remote_policy(i, self.policy)
        receive, send = self.ctx.Pipe(duplex=False)
        liveness = Liveness(self.ctx, self.heartbeat_limits)
        bundle = self.handles.bundle(
            i, cfg, policy=policy, weights=self.weights, beat=liveness.beat, stop=self.stop_event
        )
        p = self.ctx.Process(
            target=sampler_main, args=(bundle, send, os.getpid()), name=f"fastlight-sampler-{i}", daemon=True
        )
        p.start()
        send.close()  # only the sampler holds the write end now: when it dies, the reader sees EOF
        reader = threading.Thread(
            target=self._read, args=(i, receive), daemon=True, name=f"fastlight-sampler-{i}-reader"
        )
        reader.start()
        liveness.reset()
        return _Sampler(i, p, liveness, reader)

    def _read(self, index: int, conn: Any) -> None:
        """Sampler ``index``'s messages into ``self.items`` (tracebacks into ``self.errors``)."""
        with conn, contextlib.suppress(EOFError, OSError):  # EOF: the sampler exited or was killed
            while True:
                kind, tag, payload = conn.recv()
                if kind == "error":
                    self.errors[index] = payload
                    return
                self._arrival(index, time.monotonic())
                while not self.stopping:  # once stopping, drop it: no sampler blocks on a full pipe
                    with contextlib.suppress(queue.Full):
                        self.items.put((kind, index, payload), timeout=0.2)
                        break

    def _arrival(self, index: int, now: float) -> None:
        last = self._arrived.get(index)
        if last is not None:
            gap, mean = now - last, self._round_s.get(index)
            self._round_s[index] = gap if mean is None else 0.7 * mean + 0.3 * gap
        self._arrived[index] = now

    def publish(self, policy: nn.Module, version: int) -> SyncStats:
        """New weights for the samplers; an inference worker that fails during the publish is restarted
        (within the budget) and the publish made again."""
        if self.client is None:
            return self.publisher.publish(policy, version)
        with self._lock:
            while True:
                try:
                    return self.publisher.publish(policy, version)
                except Exception as e:
                    fault = self._worker_fault(time.monotonic()) if self.client.proc is not None else None
                    if fault is None or not self.client.restartable:  # a healthy worker refused it: say so
                        raise SamplerError(f"weight sync with the inference worker failed: {e}") from e
                    what, note = fault
                    if not self._restart_group(f"{what} (publishing version {version})", note):
                        raise SamplerError(
                            f"weight sync with the inference worker failed while stopping: {e}"
                        ) from e

    def request_drain(self) -> None:
        """Announce the next ``publish`` (AcceRL §inference drain; a no-op for shared memory)."""
        self.publisher.request_drain()

    def set_task_weights(self, weights: list[float]) -> None:
        """Task-sampling weights for every sampler's envs (shared memory, read before each round)."""
        self.task_weights.set(weights)

    def _receive(self, timeout: float) -> Rollout | None:
        try:
            _, self._last_sender, payload = self.items.get(timeout=timeout)
        except queue.Empty:
            return None
        return rollout_from_numpy(payload)

    def _describe(self) -> str:
        return f"alive: {[p.is_alive() for p in self.procs]}"

    def cut_in_flight(self, timeout: float) -> list[Rollout]:
        """Ask the samplers :func:`rounds_to_cut` names to end their round at their next step and take
        one item from each (what arrives within ``timeout`` seconds; later ones go into the next batch)."""
        rounds = self.handles.rounds
        if rounds is None or rounds.shared_rate:
            return []
        indices, now = [s.index for s in self.samplers], time.monotonic()
        asked = rounds_to_cut(
            indices, last_sender=self._last_sender, arrived=self._arrived, round_s=self._round_s, now=now
        )
        rounds.request(asked)
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

    def _watch(self, now: float) -> None:
        """A dead or silent sampler is restarted alone; with an inference worker, any of the group
        restarts the group. A dead forkserver stops the run."""
        self._check_forkserver()
        self._raise_reported()
        if self.client is not None:
            fault = self._worker_fault(now)
            # A worker that exited by itself (a positive code: a sampler's pipe closed on it) follows a
            # sampler's death: a sampler killed by a signal, or whose env raised, is the one named.
            consequence = fault is not None and (self.client.proc.exitcode or 0) > 0
            for s in self.samplers if fault is None or consequence else []:
                found = self._sampler_fault(s, now)
                if found is not None and (
                    fault is None or (s.proc.exitcode or 0) < 0 or found[0].startswith("crashed")
                ):
                    fault = (f"{self._sampler_name(s)} {found[0]}", found[1])
                    break
            if fault is not None:
                self._restart_group(*fault)
            return
        for s in list(self.samplers):
            if (found := self._sampler_fault(s, now)) is not None:
                self._restart_sampler(s, *found)

    def _raise_reported(self) -> None:
        """Stop on a sampler's own exception; a pipe to the inference worker broken by a dead peer is
        left to the group's restart."""
        for i, payload in sorted(self.errors.items()):
            if env_raised(payload) is None and (self.client is None or not broken_pipe(payload)):
                raise SamplerError(crashed(i, payload))

    def _sampler_fault(self, s: _Sampler, now: float) -> tuple[str, str | None] | None:
        """What is wrong with sampler ``s`` (:func:`process_fault`), once its last words are read."""
        if s.proc.exitcode is not None:
            s.reader.join(timeout=2.0)  # a dying sampler's last words come before its EOF
            self._raise_reported()
            self._check_forkserver(s.proc.exitcode)
            env_error = env_raised(self.errors.pop(s.index, ""))
            if env_error is not None:  # an env threw (a flaky simulator): restarted within the budget
                return f"crashed: {env_error}", None
        return process_fault(s, now)

    def _worker_fault(self, now: float) -> tuple[str, str | None] | None:
        """What is wrong with the inference worker, named (:func:`process_fault`); None while it serves."""
        assert self.client is not None
        self._check_forkserver(self.client.proc.exitcode)
        found, proc = process_fault(self.client, now), self.client.proc
        if found is None:
            return None
        envs = ", ".join(sorted({c.env_id for c in self.configs}))
        return f"inference worker ({proc.name}, pid {proc.pid}, env {envs}) {found[0]}", found[1]

    def _check_forkserver(self, exitcode: int | None = None) -> None:
        """A dead forkserver stops the run; after a child's exit code 255 (what every child of a dead
        forkserver reads) it gets a moment to read as dead."""
        wait_s = FORKSERVER_EXIT_S if exitcode == 255 else 0.0
        worker = None if self.client is None else self.client.proc
        check_forkserver(self._forkserver, [s.proc for s in self.samplers], worker, wait_s)

    def _sampler_name(self, s: _Sampler) -> str:
        return f"sampler {s.index} ({s.proc.name}, pid {s.proc.pid}, env {self.configs[s.index].env_id})"

    def _restart_sampler(self, s: _Sampler, what: str, note: str | None) -> None:
        """Restart sampler ``s`` within the budget, else stop naming it. Call under the lock."""
        name = self._sampler_name(s)
        self._kill(s)
        killed = "" if what.startswith(("died", "crashed")) else f"; killed it (exit code {s.proc.exitcode})"
        if self._spend_restart(f"{name} {what}{killed}", "restarting it", note, dropped=1):
            with children_ignore_stop_signals():
                self.samplers[s.index] = self._spawn(s.index)

    def _restart_group(self, what: str, note: str | None = None) -> bool:
        """Restart the inference worker and the rank's samplers within the budget, else stop naming
        ``what``. False, restarting nothing, once the pool is stopping. Call under the lock."""
        client = self.client
        assert client is not None
        for s in self.samplers:  # first, so none of them reports the worker's death as its own
            self._kill(s)
        if not client.restartable:
            raise SamplerError(
                f"{what}; a CUDA inference worker is not restarted (--data.inference.device cpu "
                "restarts it, --data.inference null restarts samplers alone)" + (f"; {note}" if note else "")
            )
        worker = client.proc
        if worker is not None and worker.exitcode is None:  # silent, or a sampler's fault: reap it
            client.reap()
            if what.startswith("inference worker"):
                what += f"; killed it (exit code {worker.exitcode})"
        n = len(self.samplers)
        action = f"restarting the inference worker and its {n} samplers (their rounds in flight dropped)"
        if not self._spend_restart(what, action, note, dropped=n):
            return False
        client.prepare_restart()
        self.errors.clear()  # broken pipes of the group just replaced
        self._spawn_all()
        return True

    def _kill(self, s: _Sampler) -> None:
        """SIGKILL (works on a SIGSTOPped process too), reap, free the locks it may have held."""
        if s.proc.exitcode is None:
            s.proc.kill()
        s.proc.join(timeout=5.0)
        s.reader.join(timeout=2.0)
        if self.shared is not None:
            self.shared.release_if_held_by(s.proc.pid)
        self.task_weights.release_if_held_by(s.proc.pid)

    def stop(self) -> None:
        self.stop_event.set()  # first: the samplers end their rounds while the stop waits for a restart
        super().stop()

    def _stop(self) -> None:
        """Ask, then terminate, then kill every sampler; then the inference worker."""
        deadline = time.monotonic() + STOP_WAIT_S
        for s in self.samplers:
            while s.proc.is_alive() and time.monotonic() < deadline:
                self._drain()
                s.proc.join(timeout=0.05)
        for s in self.samplers:
            for end in (s.proc.terminate, s.proc.kill):
                if s.proc.is_alive():
                    end()
                    s.proc.join(timeout=2.0)
        for s in self.samplers:
            s.reader.join(timeout=1.0)
        self.samplers = []
        if self.client is not None:
            self.client.stop()
        self._drain()

    def _drain(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self.items.get_nowait()


@dataclass(frozen=True)
class LocalFleet(Fleet):
    """The default ``--data.fleet``: each rank's samplers are processes on the trainer's machine."""

    shared_memory = True

    def build(self, build: FleetBuild) -> SamplerPool:
        return SamplerPool(build)
