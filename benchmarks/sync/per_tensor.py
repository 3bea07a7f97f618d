"""The per-tensor broadcast baseline of ``python -m benchmarks.sync``: one collective per tensor.

Plugs into :mod:`fastlight.weights.broadcast` through its :class:`~fastlight.weights.broadcast.Transport`
hook (``broadcast(..., transport=PER_TENSOR)`` on the trainer, ``receive(transport=PER_TENSOR)`` on
the worker); training never uses it. It is what the bucketed transport is measured against.
"""

from __future__ import annotations

import torch

from fastlight.weights.broadcast import TRAINER_RANK, SyncEndpoint


class PerTensorTransport:
    """One blocking broadcast per tensor, no packing (non-contiguous tensors go via a copy)."""

    name = "per_tensor"

    def collectives(self, endpoint: SyncEndpoint) -> int:
        return len(endpoint.layout.slots)

    def send(self, endpoint: SyncEndpoint, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            endpoint.group.bcast(t.contiguous(), TRAINER_RANK).wait()

    def recv(self, endpoint: SyncEndpoint, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            if t.is_contiguous():
                endpoint.group.bcast(t, TRAINER_RANK).wait()
            else:
                tmp = torch.empty_like(t, memory_format=torch.contiguous_format)
                endpoint.group.bcast(tmp, TRAINER_RANK).wait()
                t.copy_(tmp)


PER_TENSOR = PerTensorTransport()
