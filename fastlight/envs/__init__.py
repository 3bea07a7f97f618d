"""Environments: the Meta-World adapter, scenario-load emulation, and building envs by id.

Importing any module of this package registers fastlight's gymnasium ids
(:func:`fastlight.envs.registry.register_envs`).
"""

from fastlight.envs.registry import register_envs

register_envs()
