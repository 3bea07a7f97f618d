"""Sampler processes: each owns a Collector over its envs and a CPU copy of the policy.

A sampler loops: take the newest published weights, run ``cycles_per_step`` collection cycles,
push them as one Rollout (a super-batch along E) into the output queue (with ``cut_in_flight``,
sooner: when the trainer asks for the round under way, :mod:`fastlight.sampling.cut_requests`). With
``max_staleness = 0`` (strictly on-policy) it then waits until the trainer publishes newer
weights, so no round starts on weights older than the current version. While it waits it does
the next cycle's global reset (:meth:`Collector.reset_ahead`: a reset needs no policy), so in
``dpsa``/``sgr`` mode the reset overlaps the trainer's update instead of following it.

Errors never hang the trainer: a Python exception is sent back with its traceback, and a
hard crash (segfault, kill) is seen by the trainer through the process's exit code. A sampler
whose trainer dies exits too (``PR_SET_PDEATHSIG`` plus a parent-pid watchdog).

Each sampler has its own one-writer pipe to the trainer (a sampler killed in the middle of a send
corrupts nothing the others use) and bumps a shared heartbeat counter on every env step, every
reset and while it waits: the trainer restarts one whose counter stops (see ``SamplerPool``).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fastlight.envs.wrappers import EnvWrapper
from fastlight.procs import Liveness, start_child
from fastlight.rollout import Rollout
from fastlight.sampling.collector import Collector
from fastlight.sampling.cut_requests import CutRequestView
from fastlight.sampling.shared_cut import SharedCutView, cycle_key
from fastlight.sampling.task_weights import SharedTaskWeights
from fastlight.weights.publisher import WeightSource


@dataclass
class SamplerConfig:
    """Everything a sampler process needs to build its envs and Collector (picklable)."""

    env_id: str
    num_envs: int
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    reset_mode: str = "dpsa"
    termination_threshold: float | str = 0.5  # or "auto"
    max_horizon: int = 200
    rollout_steps: int = 128
    cycles_per_step: int = 1
    #: Keep collecting whole cycles past ``cycles_per_step`` until this many valid transitions (0 = off).
    min_valid_steps: int = 0
    max_staleness: int = 0
    #: Applied around every env, in order (``--data.env_wrappers``, e.g. ``ScenarioLoadCost``).
    env_wrappers: tuple[EnvWrapper, ...] = ()
    seed: int = 0
    nonfinite: str = "raise"
    #: ``sampler``: DPSA's termination rate over this sampler's clips; ``rank``: over every clip of
    #: the rank's local samplers (:mod:`fastlight.sampling.shared_cut`).
    truncation_scope: str = "sampler"
    #: Whether the trainer may cut this sampler's round for the batch it would miss
    #: (``--data.cut_in_flight``, asynchronous runs: :mod:`fastlight.sampling.cut_requests`).
    cut_in_flight: bool = False


def build_envs(cfg: SamplerConfig) -> list:
    """The sampler's envs: ``make_env``, inside the config's env wrappers."""
    from fastlight.envs.registry import make_env
    from fastlight.envs.wrappers import wrap_env

    envs = [make_env(cfg.env_id, env_kwargs=cfg.env_kwargs) for _ in range(cfg.num_envs)]
    return [wrap_env(e, cfg.env_wrappers) for e in envs]


def build_collector(
    cfg: SamplerConfig,
    worker_index: int,
    heartbeat: Callable[[], None] | None = None,
    shared_cut: SharedCutView | None = None,
    cut_requests: CutRequestView | None = None,
) -> Collector:
    """The Collector sampler ``worker_index`` runs, over its envs (``shared_cut``: its handle on the
    rank's :class:`~fastlight.sampling.shared_cut.SharedCut`, with ``truncation_scope: rank``;
    ``cut_requests``: its side of the rank's :class:`~fastlight.sampling.cut_requests.CutRequests`,
    with ``cut_in_flight``)."""
    if (cfg.truncation_scope == "rank") != (shared_cut is not None):
        raise ValueError(
            f"sampler {worker_index}: truncation_scope {cfg.truncation_scope!r} "
            f"{'needs' if shared_cut is None else 'takes no'} shared cut"
        )
    if cfg.cut_in_flight != (cut_requests is not None):
        raise ValueError(
            f"sampler {worker_index}: cut_in_flight {cfg.cut_in_flight} "
            f"{'needs' if cut_requests is None else 'takes no'} cut requests"
        )
    return Collector(
        build_envs(cfg),
        mode=cfg.reset_mode,
        termination_threshold=cfg.termination_threshold,
        max_horizon=cfg.max_horizon,
        rollout_steps=cfg.rollout_steps,
        seed=cfg.seed,
        nonfinite=cfg.nonfinite,
        heartbeat=heartbeat,
        shared_cut=shared_cut,
        cut_requests=cut_requests,
    )


def rollout_to_numpy(r: Rollout) -> Rollout:
    """Plain numpy arrays pickle by value: nothing depends on the sender staying alive."""
    return r.map(lambda t: t.numpy())


def rollout_from_numpy(r: Rollout) -> Rollout:
    return r.map(torch.from_numpy)


class Outbox:
    """Sends a sampler's messages through its pipe from a thread: a slow trainer that lets the pipe
    fill up blocks the send, not the sampler, which keeps beating while it waits to hand over."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.items: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.thread = threading.Thread(target=self._send, daemon=True, name="fastlight-outbox")
        self.thread.start()

    def _send(self) -> None:
        while (item := self.items.get()) is not None:
            try:
                self.conn.send(item)
            except OSError:  # the trainer closed its end (it restarted or stopped this sampler)
                return

    def put(self, item: Any, stop: Any, beat: Callable[[], None]) -> None:
        while not stop.is_set():
            try:
                self.items.put(item, timeout=0.5)
                return
            except queue.Full:
                beat()  # waiting on the trainer is not a hang

    def close(self, timeout: float) -> None:
        """Let the last message (an error report) go out, for at most ``timeout`` seconds."""
        try:
            self.items.put(None, timeout=timeout)
        except queue.Full:
            return
        self.thread.join(timeout=timeout)


def sampler_main(
    index: int,
    cfg: SamplerConfig,
    policy: nn.Module,
    weights: WeightSource,
    conn: Any,
    heartbeat: Liveness,
    stop: Any,
    parent_pid: int,
    task_weights: SharedTaskWeights | None = None,
    shared_cut: SharedCutView | None = None,
    cut_requests: CutRequestView | None = None,
) -> None:
    """Entry point of sampler process ``index`` (spawned). ``conn`` is the write end of its pipe to
    the trainer, ``heartbeat`` its :class:`~fastlight.procs.Liveness`, ``stop`` the pool's StopFlag."""
    start_child(parent_pid, seed=cfg.seed, threads=1)
    beat = heartbeat.beat
    beat()  # started: from here on the trainer holds it to --data.faults.heartbeat_s
    outbox = Outbox(conn)
    collector = None
    failed = False
    try:
        collector = build_collector(
            cfg, index, heartbeat=beat, shared_cut=shared_cut, cut_requests=cut_requests
        )
        policy.eval()
        _loop(cfg, collector, policy, weights, outbox, beat, stop, task_weights)
    except Exception:
        failed = True
        outbox.put(("error", index, traceback.format_exc()), stop, beat)
    finally:
        if collector is not None:
            collector.close()
    # Leave without the interpreter's teardown: freeing torch and the envs there takes seconds on
    # a loaded machine, time a preempted trainer waits for. Only an error report must go out first.
    outbox.close(timeout=5.0 if failed else 0.5)
    os._exit(1 if failed else 0)


def _loop(
    cfg: SamplerConfig,
    collector: Collector,
    policy: nn.Module,
    weights: WeightSource,
    outbox: Outbox,
    beat: Callable[[], None],
    stop: Any,
    task_weights: SharedTaskWeights | None = None,
) -> None:
    version = -1
    task_version = 0
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
        if task_weights is not None:  # DWR: newest task weights before the round starts
            applied = task_weights.apply(collector.envs, task_version)
            if applied != task_version:  # a reset done ahead drew its tasks from older weights
                collector.discard_ahead()
            task_version = applied
        # cut_in_flight: a request from here on ends the round at its next step (for the batch
        # the trainer is completing); a request before it was for the round already sent.
        since = collector.cut_requests.count() if collector.cut_requests is not None else None
        # The step's own cycles carry a key the rank's samplers share (truncation_scope rank);
        # extra cycles for the valid-step budget are this sampler's alone.
        parts: list[Rollout] = []
        for k in range(cfg.cycles_per_step):
            parts.append(
                collector.collect(
                    policy, policy_version=version, cut_key=cycle_key(version, k), cut_since=since
                )
            )
            if parts[-1].stats.cut_in_flight:
                break
        valid = sum(p.stats.valid_steps for p in parts)
        # the valid-step budget of one step
        while valid < cfg.min_valid_steps and not stop.is_set() and not parts[-1].stats.cut_in_flight:
            parts.append(collector.collect(policy, policy_version=version, cut_since=since))
            valid += parts[-1].stats.valid_steps
        item = rollout_to_numpy(Rollout.cat_time(parts))
        outbox.put(("rollout", version, item), stop, beat)
