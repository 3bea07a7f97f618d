"""The state at an update's start, kept on the host, so that a rank that survives another rank's loss
in the middle of an update can still write the checkpoint of the last completed one.

:class:`RollbackPoint` holds what an update changes, taken at its start: the module's trainable
parameters and buffers, the optimizers' and LR schedulers' states, the fit loop's progress and the
global step; :meth:`RollbackPoint.apply` puts them into a checkpoint dict made afterwards. Tensors are
copied into the same host buffers at every update (no allocation after the first).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import lightning as L
import torch


def _host_copy(src: Any, dst: Any = None) -> Any:
    """``src`` with every tensor copied to the host, reusing ``dst``'s tensors where they fit."""
    if isinstance(src, torch.Tensor):
        if isinstance(dst, torch.Tensor) and dst.shape == src.shape and dst.dtype == src.dtype:
            return dst.copy_(src.detach())
        return src.detach().to("cpu", copy=True)
    if isinstance(src, dict):
        old = dst if isinstance(dst, dict) else {}
        return {k: _host_copy(v, old.get(k)) for k, v in src.items()}
    if isinstance(src, list | tuple):
        old = dst if isinstance(dst, list | tuple) and len(dst) == len(src) else [None] * len(src)
        return type(src)(_host_copy(v, o) for v, o in zip(src, old, strict=True))
    return copy.deepcopy(src)


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_nbytes(v) for v in obj)
    return 0


class RollbackPoint:
    """What an update changes, as it was at the update's start (see the module docstring)."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.module: dict[str, torch.Tensor] = {}
        self.optimizers: list[Any] = []
        self.schedulers: list[Any] = []
        self.fit_loop: dict[str, Any] = {}
        self.takes = 0
        self.seconds = 0.0  # total time of the takes

    @property
    def nbytes(self) -> int:
        return _nbytes(self.module) + _nbytes(self.optimizers)

    @staticmethod
    def changing_keys(module: torch.nn.Module) -> set[str]:
        """The state-dict keys an update can change: trainable parameters and buffers."""
        trainable = {n for n, p in module.named_parameters() if p.requires_grad}
        return trainable | {n for n, _ in module.named_buffers()}

    def take(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        t0 = time.perf_counter()
        keys = self.changing_keys(module)
        state = {k: v for k, v in module.state_dict().items() if k in keys}
        self.module = _host_copy(state, self.module)
        opts = [trainer.strategy.optimizer_state(opt) for opt in trainer.optimizers]
        self.optimizers = _host_copy(opts, self.optimizers)
        self.schedulers = copy.deepcopy([c.scheduler.state_dict() for c in trainer.lr_scheduler_configs])
        self.fit_loop = copy.deepcopy(trainer.fit_loop.state_dict())
        self.step = trainer.global_step
        self.takes += 1
        self.seconds += time.perf_counter() - t0

    def apply(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """``checkpoint`` (a full one, made now) set back to the update's start."""
        if self.step is None:
            raise RuntimeError("RollbackPoint.apply before any take")
        checkpoint["state_dict"].update(self.module)
        checkpoint["optimizer_states"] = self.optimizers
        checkpoint["lr_schedulers"] = self.schedulers
        checkpoint["loops"]["fit_loop"] = self.fit_loop
        checkpoint["global_step"] = self.step
        return checkpoint
