"""fastlight's gymnasium ids, and building environments by id with errors that name the setting.

fastlight's own ids (:func:`register_envs`) are registered when any ``fastlight.envs`` module is
imported, without importing Meta-World or MuJoCo. Packages that register envs on import
(``highway_env``) are imported on demand. gymnasium's ``"my_package.envs:MyEnv-v0"`` form imports
``my_package.envs`` first, which is how a user's own envs reach the (spawned) sampler processes.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

import gymnasium as gym

from fastlight.envs.metaworld_tasks import MT10_TASKS
from fastlight.extras import MissingExtraError

#: Packages that register gymnasium ids when imported, keyed by id prefix.
_HIGHWAY_PREFIXES = "highway merge roundabout intersection racetrack parking exit two-way lane-keeping u-turn"
_REGISTERING_PACKAGES = dict.fromkeys(_HIGHWAY_PREFIXES.split(), "highway_env")


def register_envs() -> None:
    """``fastlight/MetaWorld-v0`` (MT10; ``tasks`` kwarg to change) and ``fastlight/MetaWorld-<task>``
    for each MT10 task, e.g. ``fastlight/MetaWorld-reach-v3``."""
    entry = "fastlight.envs.metaworld:MetaWorldEnv"
    if "fastlight/MetaWorld-v0" not in gym.registry:
        gym.register("fastlight/MetaWorld-v0", entry_point=entry, kwargs={"tasks": "MT10"})
    for name in MT10_TASKS:
        env_id = f"fastlight/MetaWorld-{name}"
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=entry, kwargs={"tasks": name})


def check_env_id(env_id: str, *, flag: str = "--data.env_id") -> None:
    """Raise ``ValueError`` naming ``flag`` if ``env_id`` is not a registered gymnasium id."""
    if ":" in env_id:
        module, env_id = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            raise ValueError(f"{flag}: cannot import module {module!r} named before ':' ({e})") from e
    for prefix, package in _REGISTERING_PACKAGES.items():
        if env_id.startswith(prefix):
            importlib.import_module(package)
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=5, cutoff=0.5)
    hint = f"; did you mean one of {close}?" if close else ""
    if "/" in env_id:  # a user's package registers its namespaced ids when imported
        package = env_id.split("/", 1)[0]
        own = f"; an env your package registers on import is named as {package}:{env_id} (module:id)"
        hint = own + hint
    raise ValueError(f"{flag} must be a registered gymnasium id, got {env_id!r}{hint}")


def make_env(
    env_id: str, *, env_kwargs: dict[str, Any] | None = None, flag: str = "--data.env_id"
) -> gym.Env:
    """``gym.make(env_id, **env_kwargs)`` after checking the id (and importing its package)."""
    check_env_id(env_id, flag=flag)
    try:
        return gym.make(env_id, **(env_kwargs or {}))
    except TypeError as e:
        if not env_kwargs:
            raise
        # A keyword the env's constructor does not take (gymnasium's message names it and the env).
        raise ValueError(f"--data.env_kwargs: {' '.join(str(e).split())}") from e
    except MissingExtraError:  # fastlight's own line already names the extra to install
        raise
    except ImportError as e:  # a dependency the env needs, missing or of a version it refuses
        raise ValueError(f"{flag} {env_id}: {' '.join(str(e).split())}") from e
