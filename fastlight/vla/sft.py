"""``VLASFTModule``: supervised fine-tuning of a VLA policy on demonstrations (the stage before RL).

AcceRL, SimpleVLA-RL and RLinf start RL from a VLA fine-tuned on demonstrations. This module trains the
*same* policy as the RL config (same ``--model.policy`` block) with its ``imitation_loss``: a token
policy's cross-entropy (mean over valid tokens, as FAST §SMPO), a FlowPolicy's flow matching. It
subclasses :class:`~fastlight.vla.module.VLAModule` so that its checkpoints are VLA checkpoints
(``--model.init_from`` of an RL run reads its ``policy.*`` weights); the inherited RL settings are
unused. Data: :class:`~fastlight.vla.demos.DemoDataModule` batches. Logged: ``sft/loss``,
``sft/token_accuracy``, ``sft/bin_error``, ``sft/lr``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor
from typing_extensions import override

from fastlight.models.action_mapping import action_chunk
from fastlight.vla.module import VLAModule


@runtime_checkable
class DescribesEnv(Protocol):
    """A DataModule that knows its env's :class:`~fastlight.data.env_spec.EnvSpec` (``DemoDataModule``)."""

    env_spec: Any


class VLASFTModule(VLAModule):
    """Cross-entropy fine-tuning of a VLA's action tokens on demonstrations.

    Args:
        label_smoothing: spread this much of each token's target mass over the other bins.
        bin_sigma: a Gaussian target of this width in bins around each demonstrated bin (0: one-hot).
        warmup_steps: linear learning-rate warm-up over this many optimizer steps.
        **kwargs: :class:`~fastlight.vla.module.VLAModule`'s settings (``policy``, ``lr``,
            ``value_lr``, ``max_grad_norm``, ...).
    """

    def __init__(
        self, label_smoothing: float = 0.0, bin_sigma: float = 0.0, warmup_steps: int = 100, **kwargs: Any
    ) -> None:
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"--model.label_smoothing must be in [0, 1), got {label_smoothing}")
        if not bin_sigma >= 0.0:
            raise ValueError(f"--model.bin_sigma must be >= 0 (0: one-hot targets), got {bin_sigma}")
        if warmup_steps < 0:
            raise ValueError(f"--model.warmup_steps must be >= 0, got {warmup_steps}")
        if kwargs.get("sil_steps", 0):
            raise ValueError(
                "--model.sil_steps is self-imitation of RL successes and has no effect in SFT, which "
                "imitates the demonstrations: set it in the RL config"
            )
        super().__init__(**kwargs)

    @override
    def on_fit_start(self) -> None:
        # The RL run's checks and instruction binding, so SFT and RL feed the backbone the same ids.
        super().on_fit_start()
        data = self.trainer.datamodule
        if isinstance(data, DescribesEnv):
            self.check_env_spec(data.env_spec)

    @override
    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.param_groups(), lr=self.hparams.lr, weight_decay=0.0)
        warm = max(self.hparams.warmup_steps, 1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def token_loss(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        """The policy's ``imitation_loss`` of a DemoDataModule batch: ``actions`` ``[B, A]``, or ``[B, H, A]``
        for a policy acting in chunks of ``H`` (``K = H x A`` tokens, step-major); optional ``valid``
        ``[B]``, ``[B, K]`` or with chunks ``[B, H]`` (the chunk steps past the episode's end)."""
        policy = self.policy
        actions, valid = batch["actions"], batch.get("valid")
        chunk = action_chunk(policy.action_mapping())
        if chunk is not None:
            if actions.dim() != 3 or actions.shape[1] != chunk:
                raise ValueError(
                    f"the policy acts in chunks of {chunk} (--model.policy.init_args.action_chunk): "
                    f"demonstration actions must be [B, {chunk}, A], got {tuple(actions.shape)} "
                    f"(--data.action_chunk null follows the policy)"
                )
            n, _, dims = actions.shape
            actions = actions.reshape(n, chunk * dims)  # step-major, as the policy's tokens
            if valid is not None and tuple(valid.shape) == (n, chunk):
                valid = valid.repeat_interleave(dims, dim=1)  # [B, H] -> [B, K]
        targets = {k: self.hparams.get(k, 0.0) for k in ("label_smoothing", "bin_sigma")}  # token targets
        return policy.imitation_loss(batch["obs"], actions.to(self.device), valid, **targets)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if not isinstance(batch, dict) or "actions" not in batch:
            raise TypeError(
                f"VLASFTModule trains on demonstration batches (--data fastlight.vla.demos.DemoDataModule), "
                f"got {type(batch).__name__}"
            )
        loss, info = self.token_loss(batch)
        opt = self.optimizers()
        opt.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        if (clip := self.hparams.max_grad_norm) is not None:
            self.clip_gradients(opt, gradient_clip_val=clip, gradient_clip_algorithm="norm")
        opt.step()
        self.lr_schedulers().step()
        n = int(batch["actions"].shape[0])
        self.log("sft/loss", loss.detach(), on_step=True, prog_bar=True, batch_size=n)
        self.log_dict({f"sft/{k}": v for k, v in info.items()}, on_step=True, batch_size=n)
        self.log("sft/lr", opt.param_groups[0]["lr"], on_step=True, batch_size=n)
        return loss.detach()

    @property
    @override
    def optimizer_steps_per_update(self) -> int:
        return 1
