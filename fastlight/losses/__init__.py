"""Pure tensor loss functions with the SMPO masked reduction (FAST) and AcceRL's objectives."""

from fastlight.losses.gipo import gipo_loss
from fastlight.losses.masked import masked_mean, masked_sum, masked_var, zero_invalid
from fastlight.losses.ppo import ppo_clip_loss
from fastlight.losses.ratios import GRANULARITIES, log_ratio
from fastlight.losses.sapo import sapo_loss
from fastlight.losses.value import entropy_bonus, explained_variance, value_loss

__all__ = [
    "GRANULARITIES",
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
