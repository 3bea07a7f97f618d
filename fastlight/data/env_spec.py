"""``EnvSpec``: what a policy must match in an env (flattened obs size, action size and kind)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import torch

from fastlight.data.protocols import MultiTaskEnv
from fastlight.envs.instructions import InstructionTable
from fastlight.envs.registry import make_env
from fastlight.envs.wrappers import EnvWrapper, wrap_env, wrapper_of
from fastlight.models.spaces import Spaces, describe_spaces


@runtime_checkable
class InstructedEnv(Protocol):
    """An env whose observations carry instruction token ids, declaring every row it emits and the
    sentence of each (:class:`~fastlight.envs.instructions.InstructionTable`)."""

    @property
    def instruction_table(self) -> InstructionTable: ...


@dataclass(frozen=True)
class EnvSpec:
    """What the policy must match: flattened obs size, action size, action kind.

    ``observation_space`` is the env's own space, for policies over dict observations (their
    ``obs_dim`` is 0) to check keys and shapes (e.g. ``VLAModule.check_env_spec``).
    ``instructions``: every instruction row the env emits and its sentence, for an env that declares
    them (:class:`InstructedEnv`, e.g. fastlight's Meta-World), else ``None``; a policy
    with its own tokenizer re-tokenizes them (``VLAPolicy.bind_instructions``).
    """

    obs_dim: int
    action_dim: int
    continuous: bool
    observation_space: gym.Space | None = field(default=None, compare=False, repr=False)
    instructions: InstructionTable | None = field(default=None, compare=False, repr=False)
    #: The spaces as :func:`~fastlight.models.spaces.describe_spaces` gives them (None: the MLP's).
    spaces: Spaces | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def from_env(env: gym.Env) -> EnvSpec:
        """Raises ``ValueError`` in one line for a space no policy of fastlight takes."""
        obs_space, act_space = env.observation_space, env.action_space
        obs_dim = int(math.prod(obs_space.shape)) if obs_space.shape else 0
        base = env.unwrapped
        table = base.instruction_table if isinstance(base, InstructedEnv) else None
        spaces = describe_spaces(obs_space, act_space)
        # Box, MultiDiscrete, MultiBinary (describe_spaces refused the others): the entries of one action.
        discrete = isinstance(act_space, gym.spaces.Discrete)
        action_dim = int(act_space.n) if discrete else int(math.prod(act_space.shape))
        continuous = isinstance(act_space, gym.spaces.Box)
        return EnvSpec(obs_dim, action_dim, continuous, obs_space, table, spaces)


class EnvSizes:
    """The env's sizes that the CLI links to the model (``link_arguments``, ``apply_on="instantiate"``),
    read from the DataModule's ``env_spec``."""

    env_spec: EnvSpec

    @property
    def obs_dim(self) -> int:
        return self.env_spec.obs_dim

    @property
    def action_dim(self) -> int:
        return self.env_spec.action_dim

    @property
    def continuous(self) -> bool:
        return self.env_spec.continuous

    @property
    def spaces(self) -> Spaces | None:
        return self.env_spec.spaces


@runtime_checkable
class BindsInstructions(Protocol):
    """A policy that maps the env's instruction rows to its own tokens (``VLAPolicy``)."""

    def bind_instructions(self, sentences: Sequence[str], ids: torch.Tensor, mask: torch.Tensor) -> bool: ...


def bind_instruction_table(policy: object, table: InstructionTable | None) -> bool:
    """Hand the env's instruction ``table`` to a policy that takes one; True when it bound it."""
    if table is None or not isinstance(policy, BindsInstructions):
        return False
    return policy.bind_instructions(table.sentences, torch.as_tensor(table.ids), torch.as_tensor(table.mask))


def env_spec_of(
    env_id: str, env_kwargs: dict[str, Any] | None = None, wrappers: Sequence[Mapping[str, Any]] = ()
) -> EnvSpec:
    """The :class:`EnvSpec` of env ``env_id`` built with ``env_kwargs`` inside the gymnasium ``wrappers``
    a run or checkpoint records (what the policy saw: an ActionWrapper's actions), built, read, closed."""
    env = wrap_env(make_env(env_id, env_kwargs=env_kwargs), [w for w in map(wrapper_of, wrappers)
                                                             if not isinstance(w, EnvWrapper)])  # fmt: skip
    try:
        return EnvSpec.from_env(env)
    finally:
        env.close()


def task_names_of(env: gym.Env) -> tuple[str, ...] | None:
    """The task names of a multi-task env (one that takes task weights), else None."""
    base = env.unwrapped
    return tuple(str(n) for n in base.task_names) if isinstance(base, MultiTaskEnv) else None
