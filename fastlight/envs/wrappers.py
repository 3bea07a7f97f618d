"""``EnvWrapper``: a layer of the env spec, applied around every env a run builds.

``--data.env_wrappers`` lists them (``class_path`` + ``init_args``). An ``EnvWrapper`` is the wrapper's
picklable *settings*, applied in order (first in the list = innermost) to each env the samplers make.
A gymnasium wrapper class is one too: jsonargparse makes it a ``functools.partial`` awaiting the env.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym

from fastlight.class_paths import resolve


class EnvWrapper:
    """Settings of one env wrapper; :meth:`wrap` applies it. Subclass it for a wrapper of your own."""

    def wrap(self, env: gym.Env) -> gym.Env:
        raise NotImplementedError(f"{type(self).__qualname__} must implement wrap(env) -> gym.Env")

    def __call__(self, env: gym.Env) -> gym.Env:
        return self.wrap(env)


#: What ``--data.env_wrappers`` takes: fastlight's settings objects, or gymnasium wrappers awaiting the env.
AnyEnvWrapper = EnvWrapper | Callable[[gym.Env], gym.Env]


class TupleAsDict(gym.ObservationWrapper):
    """A Tuple observation as the Dict of its parts keyed ``"0"``, ``"1"``, ...: fastlight's observations
    are a tensor or a dict of them (:mod:`fastlight.models.spaces`)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Dict({str(i): s for i, s in enumerate(env.observation_space)})

    def observation(self, observation: tuple) -> dict[str, Any]:
        return {str(i): part for i, part in enumerate(observation)}


def wrap_env(env: gym.Env, wrappers: Sequence[AnyEnvWrapper] = ()) -> gym.Env:
    """``env`` inside every wrapper of ``wrappers`` (the first one innermost), then, for a Tuple
    observation, :class:`TupleAsDict`."""
    for wrapper in wrappers:
        env = wrapper(env)
    return TupleAsDict(env) if isinstance(env.observation_space, gym.spaces.Tuple) else env


def wrapper_of(settings: Mapping[str, Any]) -> AnyEnvWrapper:
    """The wrapper that ``settings`` (``class_path`` + ``init_args``, as a config or a checkpoint records it)
    name: an :class:`EnvWrapper`, or a gymnasium wrapper class awaiting its env."""
    cls, init_args = resolve(settings["class_path"]), settings.get("init_args") or {}
    if isinstance(cls, type) and issubclass(cls, EnvWrapper):
        return cls(**init_args)
    return functools.partial(cls, **init_args)


def check_env_wrappers(wrappers: Sequence[object], *, flag: str = "--data.env_wrappers") -> None:
    """Refuse what cannot wrap an env (a programmatic caller's dict or name, say)."""
    for i, wrapper in enumerate(wrappers):
        if not callable(wrapper):
            raise TypeError(
                f"{flag}[{i}] must be a fastlight.envs.EnvWrapper or a gymnasium wrapper class "
                f"(class_path + init_args), got {type(wrapper).__name__}"
            )
