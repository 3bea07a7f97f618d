"""``--model.max_nonfinite_updates``: skip an optimizer step whose loss or gradient is NaN / inf."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from fastlight.weights.sharded import local


class NonfiniteSteps:
    """Drops a step's gradients when its loss or a gradient is NaN / inf, so that ``opt.step()`` leaves
    the weights and the optimizer state alone. ``limit`` skipped in a row stop the run; ``0`` turns the
    check off. One host sync per optimizer step; the verdict is all-reduced, so every rank skips together.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.skipped = 0  # optimizer steps skipped so far (``faults/skipped_updates``)
        self.in_a_row = 0

    def check(
        self,
        opt: torch.optim.Optimizer,
        loss: Tensor,
        params: Iterable[nn.Parameter],
        *,
        world_size: int,
        at: tuple[int, int, int, int],
    ) -> None:
        """Call between ``backward`` and ``opt.step()``; ``at``: (optim. step, update, epoch, minibatch)."""
        if not self.limit:
            return
        # A sharded (DTensor) gradient is checked on this rank's shard (the all-reduce joins the verdicts).
        grads = [g for g in (local(p.grad) for p in params if p.grad is not None) if g.numel()]
        bad = [~torch.isfinite(loss).all()]
        if grads:
            # A gradient's max-abs norm is finite exactly when every element is: one fused kernel.
            norms = torch._foreach_norm(grads, float("inf"))
            if len({(n.dtype, n.device) for n in norms}) > 1:
                norms = [n.to(loss.device, torch.float32) for n in norms]
            bad.append(~torch.isfinite(torch.stack(norms)).all().to(loss.device))
        flags = torch.stack(bad).to(torch.float32)
        if dist.is_available() and dist.is_initialized() and world_size > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        flags = flags.tolist()  # the one host sync
        if not any(flags):
            self.in_a_row = 0
            return
        opt.zero_grad(set_to_none=True)
        self.skipped, self.in_a_row = self.skipped + 1, self.in_a_row + 1
        what = "loss" if flags[0] else "gradient"
        where = f"optimizer step {at[0]} (update {at[1]}, epoch {at[2]}, minibatch {at[3]})"
        if self.in_a_row >= self.limit:
            raise FloatingPointError(
                f"non-finite {what} at {where}: {self.in_a_row} optimizer steps in a row skipped "
                f"(--model.max_nonfinite_updates {self.limit}); the weights are those before them"
            )
        rank_zero_warn(f"fastlight: non-finite {what} at {where}: step skipped")
