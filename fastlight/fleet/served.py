"""The local pool's inference worker, watched and restarted together with the samplers it serves.

With ``--data.inference``, the worker and the rank's samplers fail together (a dead worker's
samplers lose their pipe; a dead sampler's EOF ends the worker's serving loop), so any of them dead
or silent (the worker has a heartbeat too) restarts the group: the samplers are killed, the worker
is reaped and started again on fresh pipes, attached to the same shared-memory weights (the
current version, taken before it serves), and the samplers are spawned on the new pipes. It costs
one restart of the budget; every sampler's round in flight is dropped and counted. Only a CPU
worker (shared-memory weights) is restarted; a CUDA worker's failure stops the run, named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastlight.fleet.local_watch import process_fault
from fastlight.fleet.restarts import SamplerError
from fastlight.inference.client import InferenceClient
from fastlight.procs import Liveness, MemorySample


@dataclass
class ServedWorker:
    """The pool's :class:`~fastlight.inference.client.InferenceClient`, watched as a sampler is
    (:func:`~fastlight.fleet.local_watch.process_fault`), and taken down for its group's restart."""

    client: InferenceClient
    env_ids: list[str]
    memory: MemorySample | None = None  # its resident memory at the last watch, as for a sampler

    @property
    def proc(self) -> Any:
        return self.client.proc

    @property
    def liveness(self) -> Liveness:
        return self.client.liveness

    def name(self) -> str:
        envs = ", ".join(sorted(set(self.env_ids)))
        return f"inference worker ({self.proc.name}, pid {self.proc.pid}, env {envs})"

    def fault(self, now: float) -> tuple[str, str | None] | None:
        """What is wrong with the worker, named, and what its exit code means; None while it serves."""
        found = process_fault(self, now)
        return None if found is None else (f"{self.name()} {found[0]}", found[1])

    def take_down(self, what: str, note: str | None) -> str:
        """Before the group restarts: stop the run naming ``what`` if the worker is a CUDA one (not
        restarted), else reap it if it still runs (silent, or a sampler's fault). Returns ``what``,
        saying so where the worker is the process that failed."""
        if not self.client.restartable:
            raise SamplerError(
                f"{what}; a CUDA inference worker is not restarted (--data.inference.device cpu "
                "restarts it, --data.inference null restarts samplers alone)" + (f"; {note}" if note else "")
            )
        worker = self.proc
        if worker is not None and worker.exitcode is None:
            self.client.reap()
            if what.startswith("inference worker"):
                what += f"; killed it (exit code {worker.exitcode})"
        return what

    def prepare_restart(self) -> None:
        """Fresh pipes, the same shared-memory weights (:meth:`InferenceClient.prepare_restart`)."""
        self.memory = None
        self.client.prepare_restart()
