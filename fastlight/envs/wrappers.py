"""``EnvWrapper``: a layer of the env spec, applied around every env a run builds.

``--data.env_wrappers`` lists them (``class_path`` + ``init_args``), e.g.
``[{class_path: fastlight.envs.ScenarioLoadCost, init_args: {seconds: 0.2}}]``. An ``EnvWrapper``
is the wrapper's *settings*: a small picklable object that the samplers receive and apply, in
order, to each env they make (first in the list = innermost), and so does the DataModule's probe
env, so the sizes linked to the policy are those of the wrapped env.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym


class EnvWrapper:
    """Settings of one env wrapper; :meth:`wrap` applies it. Subclass it for a wrapper of your own."""

    def wrap(self, env: gym.Env) -> gym.Env:
        raise NotImplementedError(f"{type(self).__qualname__} must implement wrap(env) -> gym.Env")


def wrap_env(env: gym.Env, wrappers: Sequence[EnvWrapper] = ()) -> gym.Env:
    """``env`` inside every wrapper of ``wrappers`` (the first one innermost)."""
    for wrapper in wrappers:
        env = wrapper.wrap(env)
    return env


def check_env_wrappers(wrappers: Sequence[object], *, flag: str = "--data.env_wrappers") -> None:
    """Refuse anything that is not an :class:`EnvWrapper` (a programmatic caller's gym class, say)."""
    for i, wrapper in enumerate(wrappers):
        if not isinstance(wrapper, EnvWrapper):
            raise TypeError(
                f"{flag}[{i}] must be a fastlight.envs.EnvWrapper (class_path + init_args), "
                f"got {type(wrapper).__name__}"
            )
