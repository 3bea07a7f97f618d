"""``FaultSettings``: how a rank's pool watches, restarts and gives up on its worker processes.

``--data.faults`` holds it; every fleet (:class:`~fastlight.fleet.base.SamplerFleet`) applies it to
its samplers, and the local pool to its inference worker alike (the restart policy is Sample
Factory's habit: a process that dies without a word, or stops making progress, is restarted within
a budget).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The flag these settings live under (errors name it).
FLAG = "--data.faults"


@dataclass(frozen=True)
class FaultSettings:
    """Timeouts, heartbeat and the restart budget of a rank's sampler (and inference) processes.

    Args:
        worker_timeout_s: fail if no rollout arrives for this long; also how long a process may
            take to start (spawn, imports, building its envs) before its first heartbeat.
        max_worker_restarts: a sampler (or CPU inference worker) that dies without a traceback (a
            signal, a segfault) or hangs is restarted on the current weights, at most this many
            times per ``restart_window_s`` (0 = never); its round in flight is dropped. Counted as
            ``faults/worker_restarts`` and ``faults/dropped_rollouts``. Past the budget the run
            stops naming the process, its pid, exit code and env id.
        restart_window_s: the window, in seconds, over which ``max_worker_restarts`` counts.
        heartbeat_s: a started process that makes no progress (no env step, reset or wait) for
            this long is hung: it is killed and restarted as above. Detection takes at most
            ``heartbeat_s`` + 0.25 s once the trainer waits for data.
    """

    worker_timeout_s: float = 300.0
    max_worker_restarts: int = 3
    restart_window_s: float = 600.0
    heartbeat_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("worker_timeout_s", "restart_window_s", "heartbeat_s"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{FLAG}.{name} must be > 0, got {value}")
        if self.max_worker_restarts < 0:
            raise ValueError(f"{FLAG}.max_worker_restarts must be >= 0, got {self.max_worker_restarts}")
