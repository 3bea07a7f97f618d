"""``cpu_copy``: the samplers' CPU copy of a policy, made without a second copy on its device."""

from __future__ import annotations

import copy
from typing import Any

import torch


def cpu_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A CPU copy of ``module`` for the samplers, made without a second copy on its device.

    The samplers start after the strategy moved the model (a GPU, for a VLA): a plain
    ``deepcopy(...).to("cpu")`` would first duplicate every weight on the GPU. Seeding deepcopy's
    memo with CPU clones of the parameters and buffers copies each tensor straight to the host.
    """
    memo: dict[int, Any] = {}
    with torch.no_grad():
        for p in module.parameters():
            memo[id(p)] = torch.nn.Parameter(p.detach().to("cpu", copy=True), requires_grad=p.requires_grad)
        for b in module.buffers():
            memo[id(b)] = b.detach().to("cpu", copy=True)
    return copy.deepcopy(module, memo)
