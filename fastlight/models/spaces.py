"""The env's spaces as plain data a checkpoint keeps, and which policy takes them.

:func:`describe_spaces` reads gymnasium spaces into ``{"obs": {part: descriptor}, "action":
descriptor}`` (``--model.spaces``, linked from the data module; strings, so a checkpoint loads them
with ``weights_only``). A part is a key of a Dict observation, ``"0"``, ``"1"``, ... of a Tuple one, or
``""`` for the observation itself. Descriptors are ``"<kind> <dims joined by x>"``:

- ``image HxWxC`` / ``image CxHxW``: a uint8 Box of 3 dims in ``[0, 255]`` with 1, 3 or 4 channels
  (SB3's ``is_image_space``), encoded by the Nature-CNN (:mod:`fastlight.models.cnn`);
- ``box AxB``: any other Box (or a MultiBinary observation), flattened to float features;
- ``discrete N``: a Discrete part, one-hot; ``multidiscrete AxB``: one one-hot per entry;
- ``refused <line>``: an image smaller than the Nature-CNN takes, refused with ``<line>`` only when the
  default policy is built (:func:`refusal`);
- actions: ``discrete N``, ``box D``, ``multidiscrete AxB`` and ``multibinary N``.

``None`` (no description): a vector observation with Discrete or Box actions (``MLPActorCritic``'s).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from fastlight.models.cnn import IMAGE_CHANNELS, MIN_IMAGE_SIDE, channels_first

Spaces = dict[str, Any]

_FILTER = "gymnasium.wrappers.FilterObservation"
_FLATTEN = "gymnasium.wrappers.FlattenObservation"


def parse(descriptor: str) -> tuple[str, tuple[int, ...]]:
    """``"image 64x64x3"`` -> ``("image", (64, 64, 3))``."""
    kind, _, dims = descriptor.partition(" ")
    return kind, tuple(int(d) for d in dims.split("x")) if dims else ()


def _dims(shape: Any) -> str:
    return "x".join(str(int(d)) for d in shape) or "1"


def is_image(space: gym.Space) -> bool:
    """SB3's ``is_image_space`` with its channel check: uint8, 3 dims, ``[0, 255]``, 1/3/4 channels."""
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8 or len(space.shape) != 3:
        return False
    if np.any(space.low != 0) or np.any(space.high != 255):
        return False
    return channels_first(space.shape) or space.shape[-1] in IMAGE_CHANNELS


def _obs_part(name: str, space: gym.Space, keep: list[str | int] | None) -> str:
    """``keep``: the other parts' keys (indices of a Tuple), what FilterObservation would keep;
    ``None`` for the observation itself."""
    nested = keep is not None
    where = f"the observation part {name!r}" if nested else "the observation"
    if is_image(space):
        side = min(s for i, s in enumerate(space.shape) if i != (0 if channels_first(space.shape) else 2))
        if side < MIN_IMAGE_SIDE:  # refused only by the default policy (refusal()): a VLA may take it
            return (
                f"refused --data.env_id: {where} is a {_dims(space.shape)} image, smaller than the "
                f"Nature-CNN's {MIN_IMAGE_SIDE}x{MIN_IMAGE_SIDE}: enlarge it with --data.env_wrappers "
                "'[{class_path: gymnasium.wrappers.ResizeObservation, init_args: {shape: [64, 64]}}]'"
            )
        return f"image {_dims(space.shape)}"
    if isinstance(space, gym.spaces.Box | gym.spaces.MultiBinary):
        return f"box {_dims(space.shape)}"
    if isinstance(space, gym.spaces.Discrete):
        return f"discrete {int(space.n)}"
    if isinstance(space, gym.spaces.MultiDiscrete):
        return f"multidiscrete {_dims(np.asarray(space.nvec).reshape(-1))}"
    if nested and isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        fix = f"flatten the whole observation with --data.env_wrappers '[{{class_path: {_FLATTEN}}}]'"
    elif nested:
        kept = f"{{filter_keys: [{', '.join(map(str, keep))}]}}"
        fix = f"drop it with --data.env_wrappers '[{{class_path: {_FILTER}, init_args: {kept}}}]'"
    else:
        fix = "map it to a Box with a gymnasium ObservationWrapper in --data.env_wrappers"
    raise ValueError(
        f"--data.env_id: {where} is {space}, which fastlight's policies cannot take (Box, Discrete, "
        f"MultiDiscrete, MultiBinary, and Dict or Tuple of those): {fix}"
    )


def refusal(spaces: Spaces | None) -> str | None:
    """The one-line refusal of the first observation part the default policies cannot take (an image
    too small for the Nature-CNN), if any."""
    parts = (spaces or {}).get("obs", {}).values()
    return next((d.removeprefix("refused ") for d in parts if d.startswith("refused ")), None)


def _action(space: gym.Space) -> str:
    if isinstance(space, gym.spaces.Discrete):
        return f"discrete {int(space.n)}"
    if isinstance(space, gym.spaces.Box):
        return f"box {math.prod(space.shape)}"
    if isinstance(space, gym.spaces.MultiDiscrete | gym.spaces.MultiBinary) and len(space.shape) == 1:
        kind = "multidiscrete" if isinstance(space, gym.spaces.MultiDiscrete) else "multibinary"
        return f"{kind} {_dims(space.nvec) if kind == 'multidiscrete' else space.n}"
    shown = " ".join(str(space).split())  # a 2-dim nvec prints on two lines
    raise ValueError(
        f"--data.env_id: the env's action space {shown} is not supported: fastlight's policies take "
        "Discrete, Box, MultiDiscrete or MultiBinary (one dim) actions; map it to one with a gymnasium "
        "ActionWrapper in --data.env_wrappers"
    )


def describe_spaces(obs_space: gym.Space, action_space: gym.Space) -> Spaces | None:
    """The env's spaces as :mod:`this module <fastlight.models.spaces>` describes them; ``None`` for a
    vector observation with Discrete or Box actions (the MLP policy's). Raises ``ValueError`` in one
    line naming a part no observation tensor can hold (Text, a nested Dict) and the gymnasium wrapper
    that removes it."""
    action = _action(action_space)
    if isinstance(obs_space, gym.spaces.Dict | gym.spaces.Tuple):
        dict_space = isinstance(obs_space, gym.spaces.Dict)
        named = list(obs_space.spaces.items() if dict_space else enumerate(obs_space))
        obs = {str(k): _obs_part(str(k), s, [o for o, _ in named if o != k]) for k, s in named}
    else:
        obs = {"": _obs_part("", obs_space, None)}
    if list(obs) == [""] and obs[""].startswith("box ") and action.split()[0] in ("discrete", "box"):
        return None
    return {"obs": obs, "action": action}


def policy_notice(spaces: Spaces | None, obs_dim: int) -> str:
    """What the default policy is for these spaces, in one line (``fastlight fit`` prints it)."""
    if not spaces:
        return f"MLPActorCritic over the env's {obs_dim} observation features"
    parts = [f"{'' if key == '' else key + ': '}{d}{' (Nature-CNN)' if d.startswith('image') else ''}"
             for key, d in spaces["obs"].items()]  # fmt: skip
    return f"MultiInputActorCritic over {', '.join(parts)}; {spaces['action']} actions"
