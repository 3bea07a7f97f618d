"""Trainer-side handle on a rank's inference worker: start it, wire samplers to it, sync weights.

Each sampler gets a :class:`~fastlight.inference.remote.RemotePolicy` (its shared-memory slot and pipe
end) instead of a policy copy; the client is the pool's weight publisher on this path.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
from torch import nn

from fastlight.inference.remote import RemotePolicy, ServerVersion
from fastlight.inference.server import Slot, inference_main, rows_of, tensor_spec
from fastlight.inference.settings import InferenceSettings
from fastlight.models.base import Policy, check_policy
from fastlight.procs import Liveness, MemorySample
from fastlight.weights.broadcast import LazyBroadcaster, SyncGroupConfig, choose_backend
from fastlight.weights.double_buffer import SharedDoubleBuffer
from fastlight.weights.publisher import SyncStats

WORKER_NAME = "fastlight-inference"


def weight_path(trainer_device: torch.device | str, worker_device: torch.device | str) -> str:
    """How the trainer's weights reach its inference worker (spawned on the trainer's host), from where
    each end holds them (a bare ``"cuda"`` is device 0); ``SyncStats.mode`` of its publishes:

    - ``"shared_memory"``: a CPU worker; the double buffer in host shared memory
      (:mod:`fastlight.weights.double_buffer`).
    - ``"cuda_ipc"``: trainer and worker on one CUDA device, which NCCL cannot group; the double
      buffer's slots on that device, their CUDA IPC handles shared once (vLLM ipc weight transfer).
    - ``"bucketed"``: any other CUDA worker; the broadcast group (NCCL between two GPUs, else gloo).
    """
    trainer, worker = torch.device(trainer_device), torch.device(worker_device)
    if worker.type == "cpu":
        return "shared_memory"
    if trainer.type == worker.type == "cuda" and (trainer.index or 0) == (worker.index or 0):
        return "cuda_ipc"
    return "bucketed"


class InferenceClient:
    """Owns the inference worker process and the trainer end of its weight path (``transport``)."""

    def __init__(
        self,
        ctx: Any,
        policy: nn.Module,
        example_obs: Any,
        rows: list[int],
        settings: InferenceSettings,
        *,
        trainer_device: torch.device | str = "cpu",
    ) -> None:
        self.ctx, self.policy, self.settings = ctx, policy, settings
        self.trainer_device = torch.device(trainer_device)
        self.worker_device = settings.worker_device(self.trainer_device)
        with torch.no_grad():
            out = policy.act(example_obs, step=torch.zeros(rows_of(example_obs), dtype=torch.long))
        act_spec = tensor_spec({"actions": out.actions, "logprobs": out.logprobs})
        self.slots = [Slot.allocate(n, tensor_spec(example_obs), act_spec) for n in rows]
        self.new_pipes()
        self.version = ctx.Value("q", -1, lock=False)
        self.liveness = Liveness(ctx)  # beaten by the worker's serving loop; the pool sets its limits
        self.memory: MemorySample | None = None  # at the pool's last watch: what an OOM-killed worker held
        # "shared_memory" | "cuda_ipc" (both the double buffer) | "broadcast" (weight_path's "bucketed").
        path = weight_path(self.trainer_device, self.worker_device)
        self.transport = "broadcast" if path == "bucketed" else path
        self.shared: SharedDoubleBuffer | None = None
        self.sync_config: SyncGroupConfig | None = None
        self.broadcast: LazyBroadcaster | None = None
        if self.transport in ("shared_memory", "cuda_ipc"):  # built now: the worker maps it at start-up
            slots_on = self.worker_device if self.transport == "cuda_ipc" else "cpu"
            self.shared = SharedDoubleBuffer(policy, ctx, timeout_s=settings.sync_timeout_s, device=slots_on,
                                             worker_name=f"inference worker ({WORKER_NAME})")  # fmt: skip
        else:  # NCCL between two CUDA devices, gloo otherwise (a CPU trainer's CUDA worker).
            backend = choose_backend(self.trainer_device, self.worker_device)
            self.sync_config = SyncGroupConfig.local(backend=backend, timeout_s=settings.sync_timeout_s)
            self.broadcast = LazyBroadcaster(self.sync_config, settings.sync_bucket_mb)
        self.proc: Any = None

    def new_pipes(self) -> None:
        """One fresh pipe per sampler slot (a restarted worker cannot reuse a dead one's ends)."""
        pipes = [self.ctx.Pipe() for _ in self.slots]
        self.server_ends: list[Any] = [a for a, _ in pipes]
        self.sampler_ends: list[Any] = [b for _, b in pipes]

    def start(self, stop: Any, parent_pid: int) -> None:
        sync = self.shared if self.shared is not None else self.sync_config
        args = (self.policy, self.slots, self.server_ends, sync, self.version, stop, self.settings,
                parent_pid, str(self.worker_device), self.liveness)  # fmt: skip
        self.proc = self.ctx.Process(target=inference_main, args=args, name=WORKER_NAME, daemon=True)
        self.proc.start()
        self.liveness.reset()
        # The worker holds the server ends now; closing ours lets samplers see EOF if it dies.
        for conn in self.server_ends:
            conn.close()

    def remote_policy(self, index: int, policy: Policy) -> RemotePolicy:
        """Sampler ``index``'s proxy, applying ``policy``'s own action mapping to served actions."""
        check_policy(policy)
        return RemotePolicy(self.slots[index], self.sampler_ends[index], policy.action_mapping())

    def weights_source(self) -> ServerVersion:
        return ServerVersion(self.version)

    def close_sampler_ends(self) -> None:
        for conn in self.sampler_ends:
            conn.close()

    def request_drain(self) -> None:
        """AcceRL §inference drain: announce the sync before the update finishes."""
        if self.shared is not None:
            self.shared.request_drain()
        elif self.broadcast is not None:
            self.broadcast.request_drain()

    def publish(self, policy: nn.Module, version: int) -> SyncStats:
        """Make ``policy``'s weights the worker's ``version``; blocks until the worker has them."""
        self.check_alive()
        if self.broadcast is not None:
            return self.broadcast.publish(policy, version)
        assert self.shared is not None
        t0 = time.perf_counter()
        stats = self.shared.publish(policy, version, check=self.check_alive)
        return dataclasses.replace(stats, trainer_wait_ms=1000.0 * (time.perf_counter() - t0))

    @property
    def restartable(self) -> bool:
        """A worker on the double buffer, which still holds the last published version when a new worker
        attaches (a broadcast group would need a new rendezvous and a publish)."""
        return self.shared is not None

    def prepare_restart(self) -> None:
        """Reap the old worker, free what it may have held, and make fresh pipes; then the pool spawns
        the samplers on them and calls :meth:`start`. Call with the samplers stopped and no publish in
        flight. The new worker takes the current weights before it serves a request."""
        if not self.restartable:
            raise RuntimeError(
                "only an inference worker on the double buffer (a CPU worker, or one on the trainer's GPU) "
                "can be restarted; a worker on another GPU gets its weights over a broadcast group"
            )
        self.reap()
        assert self.shared is not None
        # It ends free: ours released, or the dead holder's (a SemLock any process may release).
        self.shared.lock.acquire(timeout=1.0)
        self.shared.lock.release()
        self.new_pipes()
        self.memory = None
        self.liveness.reset(restart=True)

    def reap(self) -> None:
        """SIGKILL the worker if it still runs (SIGSTOPped included) and reap it."""
        if self.proc is not None:
            if self.proc.exitcode is None:
                self.proc.kill()
            self.proc.join(timeout=5.0)

    def check_alive(self) -> None:
        """Raises naming the worker if it died or its heartbeat stood still too long."""
        if self.proc is None:
            return
        name = f"inference worker ({self.proc.name}, pid {self.proc.pid})"
        if not self.proc.is_alive():
            raise RuntimeError(f"{name} died with exit code {self.proc.exitcode}")
        if (hung := self.liveness.hang()) is not None:
            raise RuntimeError(f"{name} {hung}")

    def stop(self) -> None:
        if self.broadcast is not None:
            self.broadcast.close()
        if self.proc is not None:
            self.proc.join(timeout=3.0)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(timeout=2.0)
            self.proc = None
