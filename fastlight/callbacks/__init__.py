"""fastlight's callbacks, one per file; each also attaches to a plain Lightning project."""

from fastlight.callbacks.dwr import DynamicWeightedResampling
from fastlight.callbacks.env_steps import EnvStepBudget
from fastlight.callbacks.lost_rank import LostRankCheckpoint
from fastlight.callbacks.periodic_evaluation import PeriodicEvaluation
from fastlight.callbacks.preemption import PreemptionCheckpoint
from fastlight.callbacks.progress import RolloutProgressBar
from fastlight.callbacks.throughput import RolloutThroughput
from fastlight.callbacks.timed_checkpoint import TimedCheckpoint
from fastlight.callbacks.weight_sync import WeightSync

__all__ = [
    "DynamicWeightedResampling",
    "EnvStepBudget",
    "LostRankCheckpoint",
    "PeriodicEvaluation",
    "PreemptionCheckpoint",
    "RolloutProgressBar",
    "RolloutThroughput",
    "TimedCheckpoint",
    "WeightSync",
]
