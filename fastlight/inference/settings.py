"""``InferenceSettings``: the one object that turns on a rank's inference worker and sets it up.

``--data.inference`` holds it (``null``, the default: every sampler acts with its own policy copy).
AcceRL §inference: one process holds the policy and serves all samplers of a rank with dynamic batching.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: The flag these settings live under (errors name it).
FLAG = "--data.inference"


@dataclass(frozen=True)
class InferenceSettings:
    """The inference worker of a rank.

    Args:
        device: where the worker holds the policy: ``None`` = the trainer's device (``cpu``, or the
            rank's GPU), else ``cpu`` or ``cuda:N``; it decides how weights reach the worker
            (:func:`fastlight.inference.client.weight_path`).
        max_batch: dynamic batching: a forward pass serves at most this many env rows ...
        max_wait_ms: ... and waits at most this long for more requests (stragglers first).
        sync_bucket_mb: trainer -> CUDA worker broadcast in flat buckets of this size.
        sync_timeout_s: a weight sync whose peer is silent for this long is an error.
        threads: torch intra-op threads of a CPU worker. ``None`` (default): half the cores the
            rank's samplers leave on this machine, at least 1; torch's default when
            ``OMP_NUM_THREADS`` is set.
    """

    device: str | None = None
    max_batch: int = 256
    max_wait_ms: float = 2.0
    sync_bucket_mb: float = 64.0
    sync_timeout_s: float = 60.0
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"{FLAG}.threads must be null (auto) or >= 1, got {self.threads}")
        for name in ("max_batch", "max_wait_ms", "sync_bucket_mb", "sync_timeout_s"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{FLAG}.{name} must be > 0, got {value}")
        _check_device(self.device)

    def worker_device(self, trainer_device: torch.device | str) -> torch.device:
        """Where the worker runs: :attr:`device`, or the trainer's own device when it is None."""
        return torch.device(self.device or trainer_device)


def _check_device(device: str | None) -> None:
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"{FLAG}.device must be null, 'cpu' or 'cuda[:N]', got {device!r}")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{FLAG}.device is {device!r} but this machine has no CUDA device")
    if parsed.type == "cuda" and (parsed.index or 0) >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ValueError(f"{FLAG}.device is {device!r} but only {count} CUDA devices exist")
