"""What a sampler carries across a checkpoint, so that "N updates, stop, resume, M more" samples what
"N + M straight" samples.

A sampler's randomness is a function of what the checkpoint holds: its **action noise** (every round
reseeds torch, numpy and ``random``: :func:`seed_round`) and its **envs** (every global reset seeds env
``i`` from the sampler's seed, its count of global resets and ``i``: :func:`reset_seed`). In ``autoreset``
mode the envs themselves are saved after every round (:func:`env_state`: a MuJoCo env's integration
state and RNG, any other env pickled whole, and every wrapper's plain attributes).
"""

from __future__ import annotations

import pickle
import random
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.utils import EzPickle

#: Attribute values a wrapper's or env's state is taken from (objects are configuration or
#: references, e.g. the spaces or the simulator, and are handled apart or left as built).
_PLAIN = (bool, int, float, str, bytes, np.ndarray, np.generic, type(None))


@dataclass  # not frozen: Lightning's batch transfer rebuilds the dataclasses a batch holds
class SamplerState:
    """Sampler ``index``'s position after the round it sent with ``version``: the rounds and global
    resets it has done, and (``autoreset``) its envs mid-episode with the Collector's carry-over.
    ``exact`` is False where an env's state could not be saved."""

    version: int
    rounds: int
    resets: int
    envs: bytes | None = None
    exact: bool = True


def _seed(*key: int) -> int:
    return int(np.random.SeedSequence([abs(int(k)) for k in key]).generate_state(1)[0])


def reset_seed(seed: int, resets: int, i: int) -> int:
    """The seed of env ``i``'s reset in a sampler's global reset number ``resets``: ``seed + i`` for
    the first (the seed an env error names), then drawn from all three."""
    return seed + i if resets == 0 else _seed(seed, resets, i)


def seed_round(seed: int, rounds: int) -> None:
    """Reseed the sampler's global generators before its round number ``rounds``."""
    s = _seed(seed, rounds, 1 << 20)  # apart from every reset seed of the same sampler
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def _plain(obj: Any) -> dict[str, Any]:
    return {k: v.copy() if isinstance(v, np.ndarray) else v
            for k, v in vars(obj).items() if isinstance(v, _PLAIN)}  # fmt: skip


def _restore_plain(obj: Any, values: dict[str, Any]) -> None:
    for k, v in values.items():
        setattr(obj, k, v.copy() if isinstance(v, np.ndarray) else v)


def _mujoco_state(base: gym.Env) -> tuple[Any, Any, Any] | None:
    """``(model, data, spec)`` of a MuJoCo env (gymnasium's and Meta-World's), else None."""
    try:
        import mujoco
    except ImportError:
        return None
    model, data = vars(base).get("model"), vars(base).get("data")
    if not isinstance(model, mujoco.MjModel) or not isinstance(data, mujoco.MjData):
        return None
    return model, data, mujoco.mjtState.mjSTATE_INTEGRATION


def _unwrap(env: gym.Env) -> tuple[list[gym.Wrapper], gym.Env]:
    """``(wrappers outermost first, base env)``."""
    wrappers = []
    while isinstance(env, gym.Wrapper):
        wrappers.append(env)
        env = env.env
    return wrappers, env


def env_state(env: gym.Env) -> bytes | None:
    """The env's state as bytes (see the module docstring), or None where it cannot be saved: an env
    that pickles by its constructor's arguments (gymnasium's ``EzPickle``) and is not MuJoCo."""
    wrappers, base = _unwrap(env)
    layers = [_plain(w) for w in wrappers]
    if isinstance(base, EzPickle):  # its pickle rebuilds a fresh env: save the simulator instead
        sim = _mujoco_state(base)
        if sim is None:
            return None
        import mujoco

        model, data, spec = sim
        physics = np.empty(mujoco.mj_stateSize(model, spec))
        mujoco.mj_getState(model, data, physics, spec)
        body: tuple[Any, ...] = ("mujoco", physics, _plain(base), base.np_random.bit_generator.state)
    else:
        try:
            body = ("pickle", pickle.dumps(base))
        except Exception:  # an env holding a handle (a socket, a renderer) does not pickle
            return None
    return pickle.dumps((layers, body))


def restore_env(env: gym.Env, state: bytes) -> gym.Env:
    """Put ``state`` (from :func:`env_state` of an env built the same way) into ``env``; returns the
    env to use (a pickled base env replaces the built one inside its wrappers)."""
    layers, body = pickle.loads(state)
    wrappers, e = _unwrap(env)
    if len(wrappers) != len(layers):
        raise ValueError(f"saved env state has {len(layers)} wrappers, this env {len(wrappers)}")
    for w, values in zip(wrappers, layers, strict=True):
        _restore_plain(w, values)
    if body[0] == "mujoco":
        import mujoco

        sim = _mujoco_state(e)
        if sim is None:
            raise ValueError(f"saved env state is a MuJoCo simulator's; {type(e).__name__} has none")
        model, data, spec = sim
        _, physics, values, rng = body
        _restore_plain(e, values)
        e.np_random.bit_generator.state = rng
        mujoco.mj_setState(model, data, physics, spec)
        mujoco.mj_forward(model, data)  # derived quantities (positions, sensors) for the next obs
        mujoco.mj_setState(model, data, physics, spec)  # forward may touch the warm start: put it back
        return env
    base = pickle.loads(body[1])
    if wrappers:
        wrappers[-1].env = base
        return env
    return base
