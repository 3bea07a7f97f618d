"""Building environments by id, with errors that name the setting and suggest close ids.

Ids are gymnasium ids. Packages that register envs on import (``highway_env``, the Meta-World
adapter) are imported on demand, so ``--data.env_id merge-v0`` just works. gymnasium's
``"my_package.envs:MyEnv-v0"`` form imports ``my_package.envs`` first, which is how a user's
own envs reach the (spawned) sampler processes.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

import gymnasium as gym

#: Packages that register gymnasium ids when imported, keyed by id prefix.
_REGISTERING_PACKAGES = {
    "highway": "highway_env",
    "merge": "highway_env",
    "roundabout": "highway_env",
    "intersection": "highway_env",
    "racetrack": "highway_env",
    "parking": "highway_env",
    "exit": "highway_env",
    "two-way": "highway_env",
    "lane-keeping": "highway_env",
    "u-turn": "highway_env",
    "fastlight/": "fastlight.envs.metaworld",
}


def _import_registering_package(env_id: str) -> None:
    for prefix, module in _REGISTERING_PACKAGES.items():
        if env_id.startswith(prefix):
            importlib.import_module(module)


def check_env_id(env_id: str, *, flag: str = "--data.env_id") -> None:
    """Raise ``ValueError`` naming ``flag`` if ``env_id`` is not a registered gymnasium id."""
    if ":" in env_id:
        module, env_id = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            raise ValueError(f"{flag}: cannot import module {module!r} named before ':' ({e})") from e
    _import_registering_package(env_id)
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=5, cutoff=0.5)
    hint = f"; did you mean one of {close}?" if close else ""
    raise ValueError(f"{flag} must be a registered gymnasium id, got {env_id!r}{hint}")


def make_env(
    env_id: str, *, env_kwargs: dict[str, Any] | None = None, flag: str = "--data.env_id"
) -> gym.Env:
    """``gym.make(env_id, **env_kwargs)`` after checking the id (and importing its package)."""
    check_env_id(env_id, flag=flag)
    return gym.make(env_id, **(env_kwargs or {}))
