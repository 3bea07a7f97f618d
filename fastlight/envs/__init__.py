"""Environments: the Meta-World adapter, env wrappers (scenario-load emulation), building envs by id.

Importing any module of this package registers fastlight's gymnasium ids
(:func:`fastlight.envs.registry.register_envs`).
"""

from fastlight.envs.registry import register_envs
from fastlight.envs.scenario_cost import ScenarioLoadCost
from fastlight.envs.wrappers import EnvWrapper

register_envs()

__all__ = ["EnvWrapper", "ScenarioLoadCost", "register_envs"]
