"""A full checksum of a module's weights, for the tests and benchmarks that compare two copies
bit for bit (the package's own check is :func:`fastlight.weights.checksum.delivery_checksum`)."""

from __future__ import annotations

from torch import nn


def weights_checksum(module: nn.Module) -> float:
    """Order-dependent float64 checksum of a module's parameters (a half-updated model differs:
    each tensor's sum is weighted by its position, so swapped or partly copied tensors change it)."""
    total = 0.0
    for i, p in enumerate(module.parameters()):
        total += float(p.detach().double().sum()) * (i + 1)
    return total
