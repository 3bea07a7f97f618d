"""Pure tensor loss functions with the SMPO masked reduction (FAST) and AcceRL's objectives."""

from fastlight.losses.gipo import gipo_loss
from fastlight.losses.masked import masked_mean, masked_sum, masked_var, zero_invalid
from fastlight.losses.ppo import ppo_clip_loss
from fastlight.losses.ratios import GRANULARITIES, log_ratio
from fastlight.losses.sapo import sapo_loss
from fastlight.losses.value import entropy_bonus, explained_variance, value_loss

#: Policy objectives by name. All take ``logprobs, old_logprobs, advantages, valid, granularity,
#: tokens_per_action, clip_eps, count`` (keyword-only) plus their own hyper-parameters
#: (GIPO ``sigma``, SAPO ``tau_pos``/``tau_neg``) and return ``(loss, info)``.
OBJECTIVES = {"ppo": ppo_clip_loss, "gipo": gipo_loss, "sapo": sapo_loss}

__all__ = [
    "GRANULARITIES",
    "OBJECTIVES",
    "entropy_bonus",
    "explained_variance",
    "gipo_loss",
    "log_ratio",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "ppo_clip_loss",
    "sapo_loss",
    "value_loss",
    "zero_invalid",
]
