"""fastlight: a PyTorch Lightning framework for fast RL when episodes have very uneven lengths.

The names a user's code and configs spell, at the top (``fastlight.RLModule``). They load on first use
(PEP 562), so ``import fastlight`` stays cheap in a sampler process; a misspelt name is an
``AttributeError`` naming it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # LightningModules
    "RLModule": "fastlight.modules.rl_module",
    "VLAModule": "fastlight.vla.module",
    "VLASFTModule": "fastlight.vla.sft",
    # objectives (--model.objective)
    "Objective": "fastlight.modules.objectives",
    "PPOClip": "fastlight.modules.objectives",
    "GIPO": "fastlight.modules.objectives",
    "SAPO": "fastlight.modules.objectives",
    # data, and its settings by concern (--data.inference, --data.faults, --data.env_wrappers)
    "RolloutDataModule": "fastlight.data.datamodule",
    "InferenceSettings": "fastlight.inference.settings",
    "FaultSettings": "fastlight.fleet.faults",
    "EnvWrapper": "fastlight.envs.wrappers",
    "ScenarioLoadCost": "fastlight.envs.scenario_cost",
    "EnvSpec": "fastlight.data.env_spec",
    "DemoDataModule": "fastlight.vla.demos",
    "Rollout": "fastlight.rollout",
    # policies
    "Policy": "fastlight.models.base",
    "PolicyBase": "fastlight.models.base",
    "TokenPolicy": "fastlight.models.base",
    "ActOutput": "fastlight.models.base",
    "EvalOutput": "fastlight.models.base",
    "MLPActorCritic": "fastlight.models.mlp",
    "MultiInputActorCritic": "fastlight.models.multi_input",
    "VLAPolicy": "fastlight.vla.policy",
    "LoRASettings": "fastlight.vla.lora",
    # callbacks
    "DynamicWeightedResampling": "fastlight.callbacks.dwr",
    "EnvStepBudget": "fastlight.callbacks.env_steps",
    "LostRankCheckpoint": "fastlight.callbacks.lost_rank",
    "PeriodicEvaluation": "fastlight.callbacks.periodic_evaluation",
    "PreemptionCheckpoint": "fastlight.callbacks.preemption",
    "RolloutProgressBar": "fastlight.callbacks.progress",
    "RolloutThroughput": "fastlight.callbacks.throughput",
    "TimedCheckpoint": "fastlight.callbacks.timed_checkpoint",
    "WeightSync": "fastlight.callbacks.weight_sync",
}

__all__ = [
    "ActOutput",
    "DemoDataModule",
    "DynamicWeightedResampling",
    "EnvSpec",
    "EnvStepBudget",
    "EnvWrapper",
    "EvalOutput",
    "FaultSettings",
    "GIPO",
    "InferenceSettings",
    "LoRASettings",
    "LostRankCheckpoint",
    "MLPActorCritic",
    "MultiInputActorCritic",
    "PeriodicEvaluation",
    "Objective",
    "PPOClip",
    "Policy",
    "PolicyBase",
    "PreemptionCheckpoint",
    "RLModule",
    "Rollout",
    "RolloutDataModule",
    "RolloutProgressBar",
    "RolloutThroughput",
    "SAPO",
    "ScenarioLoadCost",
    "TimedCheckpoint",
    "TokenPolicy",
    "VLAModule",
    "VLAPolicy",
    "VLASFTModule",
    "WeightSync",
]


def __getattr__(name: str) -> Any:
    if (module := _EXPORTS.get(name)) is None:
        names = ", ".join(__all__)
        raise AttributeError(f"module 'fastlight' has no attribute {name!r} (public names: {names})")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:  # static checkers and IDEs see the real classes
    from fastlight.callbacks.dwr import DynamicWeightedResampling
    from fastlight.callbacks.env_steps import EnvStepBudget
    from fastlight.callbacks.lost_rank import LostRankCheckpoint
    from fastlight.callbacks.periodic_evaluation import PeriodicEvaluation
    from fastlight.callbacks.preemption import PreemptionCheckpoint
    from fastlight.callbacks.progress import RolloutProgressBar
    from fastlight.callbacks.throughput import RolloutThroughput
    from fastlight.callbacks.timed_checkpoint import TimedCheckpoint
    from fastlight.callbacks.weight_sync import WeightSync
    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.data.env_spec import EnvSpec
    from fastlight.envs.scenario_cost import ScenarioLoadCost
    from fastlight.envs.wrappers import EnvWrapper
    from fastlight.fleet.faults import FaultSettings
    from fastlight.inference.settings import InferenceSettings
    from fastlight.models.base import ActOutput, EvalOutput, Policy, PolicyBase, TokenPolicy
    from fastlight.models.mlp import MLPActorCritic
    from fastlight.models.multi_input import MultiInputActorCritic
    from fastlight.modules.objectives import GIPO, SAPO, Objective, PPOClip
    from fastlight.modules.rl_module import RLModule
    from fastlight.rollout import Rollout
    from fastlight.vla.demos import DemoDataModule
    from fastlight.vla.lora import LoRASettings
    from fastlight.vla.module import VLAModule
    from fastlight.vla.policy import VLAPolicy
    from fastlight.vla.sft import VLASFTModule
