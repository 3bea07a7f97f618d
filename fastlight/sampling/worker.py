"""Sampler processes: each owns a Collector over its envs and a CPU copy of the policy.

A sampler loops: take the newest published weights, run ``cycles_per_step`` collection cycles, push
them as one Rollout into its pipe. With ``max_staleness = 0`` it then waits for newer weights, doing
the next cycle's global reset meanwhile (:meth:`Collector.reset_ahead`), so the reset overlaps the
trainer's update.

A Ray actor runs the same :func:`run_sampler`. Errors never hang the trainer: an exception is sent back
with its traceback, a hard crash is seen through the exit code, and a sampler whose trainer dies exits.
"""

from __future__ import annotations

import gc
import math
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from fastlight.models.base import ServedPolicy
from fastlight.procs import start_child
from fastlight.rollout import Rollout
from fastlight.sampling.bundle import SamplerBundle
from fastlight.sampling.collector import Collector
from fastlight.weights.checksum import delivery_checksum


def rollout_to_numpy(r: Rollout) -> Rollout:
    """Plain numpy arrays pickle by value: nothing depends on the sender staying alive."""
    return r.map(lambda t: t.numpy())


def rollout_from_numpy(r: Rollout) -> Rollout:
    return r.map(torch.from_numpy)


class Handoff:
    """Where a sampler's items go, one finished item at a time, handed over to whoever takes it (the Ray
    actor's trainer call, or :class:`Outbox`'s sender thread); the sampler keeps beating while it waits."""

    def __init__(self) -> None:
        self.items: queue.Queue[Any] = queue.Queue(maxsize=1)

    def put(self, item: Any, stop: Any, beat: Callable[[], None]) -> None:
        while not stop.is_set():
            try:
                self.items.put(item, timeout=0.5)
                return
            except queue.Full:
                beat()  # waiting on the trainer is not a hang


class Outbox(Handoff):
    """Sends a sampler's messages through its pipe from a thread: a slow trainer that lets the pipe
    fill up blocks the send, not the sampler, which keeps beating while it waits to hand over."""

    def __init__(self, conn: Any) -> None:
        super().__init__()
        self.conn = conn
        self.thread = threading.Thread(target=self._send, daemon=True, name="fastlight-outbox")
        self.thread.start()

    def _send(self) -> None:
        while (item := self.items.get()) is not None:
            try:
                self.conn.send(item)
            except OSError:  # the trainer closed its end (it restarted or stopped this sampler)
                return

    def close(self, timeout: float) -> None:
        """Let the last message (an error report) go out, for at most ``timeout`` seconds."""
        try:
            self.items.put(None, timeout=timeout)
        except queue.Full:
            return
        self.thread.join(timeout=timeout)


def sampler_main(bundle: SamplerBundle, conn: Any, parent_pid: int) -> None:
    """Entry point of a sampler process (spawned): ``bundle`` is what the sampler is given, ``conn`` the
    write end of its pipe to the trainer, ``parent_pid`` the trainer's pid (the process dies with it)."""
    start_child(parent_pid, seed=bundle.config.seed, threads=1)
    bundle.beat()  # started: from here on the trainer holds it to --data.faults.heartbeat_s
    outbox = Outbox(conn)
    failed = run_sampler(bundle, outbox)
    # Leave without the interpreter's slow teardown (a preempted trainer waits for it).
    outbox.close(timeout=5.0 if failed else 0.5)
    os._exit(1 if failed else 0)


def run_sampler(bundle: SamplerBundle, outbox: Handoff) -> bool:
    """Build the sampler's Collector and run its rounds until the stop; an exception goes out as
    ``("error", index, traceback)``. Returns whether it failed."""
    collector = None
    try:
        collector = Collector.for_sampler(bundle)
        bundle.policy.eval()
        # What the sampler holds from its start never becomes garbage: frozen, collections skip it.
        gc.collect()
        gc.freeze()
        _loop(bundle, collector, outbox)
    except Exception:
        outbox.put(("error", bundle.index, traceback.format_exc()), bundle.stop, bundle.beat)
        return True
    finally:
        if collector is not None:
            collector.close()
    return False


def _loop(bundle: SamplerBundle, collector: Collector, outbox: Handoff) -> None:
    cfg, policy, weights, task_weights = bundle.config, bundle.policy, bundle.weights, bundle.task_weights
    beat, stop = bundle.beat, bundle.stop
    version, task_version, resume = -1, 0, cfg.resume
    # For the DeliveryCheck: a served policy's answers carry their checksum; a copy's is taken per load.
    served, held = isinstance(policy, ServedPolicy), math.nan
    while not stop.is_set():
        latest = weights.version
        if latest < 0 or (cfg.max_staleness == 0 and latest == version):
            beat()  # waiting for the trainer's next update is not a hang
            if task_weights is not None:  # DWR: the newest task weights before resetting ahead
                task_version = task_weights.apply(collector.envs, task_version)
            collector.reset_ahead()  # the next cycle's global reset needs no policy: do it now
            time.sleep(0.002)  # wait for the first / a newer policy (strictly on-policy)
            continue
        if latest != version:
            version = weights.load_into(policy)
            held = math.nan if served else delivery_checksum(policy).value
            if resume is not None and resume.version + 1 == version:  # the checkpoint's next round
                collector.restore(resume)
            resume = None
        collector.begin_round()
        if task_weights is not None:  # DWR: newest task weights before the round starts
            applied = task_weights.apply(collector.envs, task_version)
            if applied != task_version:  # a reset done ahead drew its tasks from older weights
                collector.discard_ahead()
            task_version = applied
        # The step's own cycles end with the rank's samplers; extra ones (valid-step budget) are its own.
        parts: list[Rollout] = []
        for k in range(cfg.cycles_per_step):
            parts.append(collector.collect(policy, policy_version=version, cycle=k))
            if parts[-1].stats.cut_in_flight:
                break
        valid = sum(p.stats.valid_steps for p in parts)
        while valid < cfg.min_valid_steps and not stop.is_set() and not parts[-1].stats.cut_in_flight:
            parts.append(collector.collect(policy, policy_version=version))
            valid += parts[-1].stats.valid_steps
        item = rollout_to_numpy(Rollout.cat(parts, dim=0))
        item.stats.sampler = bundle.index
        item.stats.sampler_states = {bundle.index: collector.state(version)}
        served_by = ("the inference worker", policy.last_version, policy.last_checksum) if served else None
        item.stats.weights_held = [served_by or (f"sampler {bundle.index}", version, held)]
        outbox.put(("rollout", version, item), stop, beat)
        # Per-episode reference cycles (a highway-env road) would otherwise pile up in the oldest generation.
        gc.collect()
