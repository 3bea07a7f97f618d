"""The train/rollout mismatch meter: how far apart the samplers' and the learner's log-likelihoods of
the same actions are, before the update moves anything (the ratios start at 1 only when they agree).

Each update measures ``|log π_behaviour − log π_learner|`` per entry on its first minibatch, before its
optimizer step, and logs the mean and the max as ``rollout/logp_mismatch_mean`` / ``_max``. The one-line
warning (once per run, above :data:`WARN_ABOVE`) fires on batches sampled with the current weights only.
"""

from __future__ import annotations

from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

#: Mean |Δ log-likelihood| per entry above which the run is warned.
WARN_ABOVE = 1e-3


class LogpMismatch:
    """Measures one minibatch per update (:meth:`measure`) and reports it (:meth:`metrics`)."""

    def __init__(self) -> None:
        self.warned = False
        self._stats: tuple[Tensor, Tensor, Tensor] | None = None

    def measure(self, *, learner: Tensor, behaviour: Tensor, fresh: Tensor) -> None:
        """``learner`` / ``behaviour``: log-likelihoods of the same actions ``[N, ...]``; ``fresh``: a bool
        scalar, whether the batch was sampled with the weights being trained. No host sync."""
        gap = (learner.detach().float() - behaviour.float()).abs()
        self._stats = (gap.mean(), gap.max(), fresh)

    def metrics(self) -> dict[str, Tensor]:
        """This update's figures (none when it measured nothing); warns once, in one line."""
        if self._stats is None:
            return {}
        mean, biggest, fresh = self._stats
        self._stats = None
        if not self.warned and bool(fresh) and float(mean) > WARN_ABOVE:
            self.warned = True
            rank_zero_warn(  # a warning, as the run's other advice is (fastlight.data.advice)
                f"fastlight: the learner scores the samplers' actions {float(mean):.1e} nats apart per entry "
                f"(max {float(biggest):.1e}) before any update, above {WARN_ABOVE:g}: the ratios do not "
                "start at 1. Usual causes: --trainer.precision bf16 (samplers act in fp32), an inference "
                "worker on another device, dropout in the policy (LoRA); see rollout/logp_mismatch_mean"
            )
        return {"rollout/logp_mismatch_mean": mean, "rollout/logp_mismatch_max": biggest}


def on_current_weights(policy_version: Tensor, valid: Tensor, version: int) -> Tensor:
    """Whether every valid step of a batch was sampled with weights ``version`` (a bool tensor, no sync)."""
    return ((policy_version == version) | ~valid.bool()).all()
