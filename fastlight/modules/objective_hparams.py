"""The objective in hparams, configs and checkpoints, and the settings it replaced.

``RLModule`` takes its policy objective as an :class:`~fastlight.modules.objectives.Objective`
object. Its hparams (and so checkpoints and ``hparams.yaml``) hold it as plain data,
``{"class_path": ..., "init_args": {...}}``, as LightningCLI writes it.

Before, the objective was a name with flattened settings: ``objective: gipo``, ``clip_eps``,
``gipo_sigma``, ``sapo_tau_pos``, ``sapo_tau_neg``. A config or command line that still writes them
is refused with one line saying what to write instead (:func:`refusal`, :func:`legacy_setting_hint`);
a checkpoint saved with them is mapped to the objective it trained with
(:func:`legacy_objective`, used by ``RLModule.load_from_checkpoint`` through
:func:`legacy_load_kwargs`), so old checkpoints still load.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.core.saving import _ALLOWED_INSTANTIATORS

from fastlight.class_paths import class_path, resolve
from fastlight.modules.objectives import GIPO, SAPO, Objective, PPOClip

__all__ = ["LEGACY_KEYS", "as_objective", "legacy_load_kwargs", "legacy_objective", "legacy_setting_hint"]

#: Objective names of the old ``--model.objective <name>`` and their classes.
LEGACY_NAMES: dict[str, type[Objective]] = {"ppo": PPOClip, "gipo": GIPO, "sapo": SAPO}
#: Old flat module settings -> (the objective they belonged to, their name in its init_args).
LEGACY_KEYS: dict[str, tuple[str, str]] = {
    "clip_eps": ("ppo", "clip_eps"),
    "gipo_sigma": ("gipo", "sigma"),
    "sapo_tau_pos": ("sapo", "tau_pos"),
    "sapo_tau_neg": ("sapo", "tau_neg"),
}
_EXAMPLE = {"ppo": "clip_eps 0.2", "gipo": "sigma 0.5", "sapo": "tau_pos 1.0"}
_CLI = "lightning.pytorch.cli.instantiate_module"


def refusal(name: str) -> str:
    """One line: ``--model.objective 'gipo' is a string; write --model.objective GIPO ...``."""
    cls = LEGACY_NAMES.get(name.lower())
    if cls is None:
        return (
            f"--model.objective {name!r} is a string; write a class, e.g. --model.objective GIPO "
            f"(one of {' | '.join(c.__name__ for c in LEGACY_NAMES.values())}, or your Objective subclass)"
        )
    key, value = _EXAMPLE[name.lower()].split()
    return (
        f"--model.objective {name!r} is a string; write --model.objective {cls.__name__} "
        f"--model.objective.{key} {value} (YAML: objective: {{class_path: {class_path(cls)}, "
        f"init_args: {{{key}: {value}}}}})"
    )


def _key_refusal(key: str) -> str:
    name, arg = LEGACY_KEYS[key]
    cls = LEGACY_NAMES[name]
    return (
        f"--model.{key} is gone: the objective holds its settings; write --model.objective {cls.__name__} "
        f"--model.objective.{arg} <value> (YAML: objective: {{class_path: {class_path(cls)}, "
        f"init_args: {{{arg}: <value>}}}})"
    )


def as_objective(value: Any, default: type[Objective]) -> Objective:
    """``value`` as an Objective: an object, ``None`` (``default()``) or a ``class_path`` mapping
    (how hparams hold it). A string, the old way, is refused with what to write instead."""
    if value is None:
        return default()
    if isinstance(value, Objective):
        return value
    if isinstance(value, str):
        raise ValueError(refusal(value))
    if isinstance(value, Mapping) and isinstance(value.get("class_path"), str):
        cls = resolve(value["class_path"])
        if isinstance(cls, type) and issubclass(cls, Objective):
            return cls(**dict(value.get("init_args") or {}))
    raise TypeError(
        f"--model.objective must be an Objective (class_path + init_args, e.g. GIPO), got {value!r}"
    )


def _is_objective(path: str) -> bool:
    cls = resolve(path)
    return isinstance(cls, type) and issubclass(cls, Objective)


def legacy_setting_hint(message: str) -> str | None:
    """For jsonargparse's refusal of an old objective setting (``message``), the one line saying
    what to write instead; ``None`` for any other parse error."""
    match = re.search(r'Parser key "objective":[^"]*?import path string: (\w+)', message)
    if match:
        return refusal(match.group(1))
    for match in re.finditer(r"class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", message):
        class_path, key = match.groups()
        if key in LEGACY_KEYS and not _is_objective(class_path):  # a module's, not e.g. GIPO's
            return _key_refusal(key)
    match = re.search(rf"unrecognized arguments: .*--model\.({'|'.join(LEGACY_KEYS)})\b", message)
    return _key_refusal(match.group(1)) if match else None


def legacy_objective(hparams: Mapping[str, Any]) -> Objective | None:
    """The objective an old checkpoint's hparams describe (``objective: gipo``, ``gipo_sigma``,
    ...), ``None`` when they are new ones."""
    name = hparams.get("objective")
    if not isinstance(name, str) and not any(k in hparams for k in LEGACY_KEYS):
        return None
    name = name.lower() if isinstance(name, str) else "ppo"
    if name not in LEGACY_NAMES:
        raise ValueError(refusal(name))
    args = {arg: hparams[k] for k, (owner, arg) in LEGACY_KEYS.items() if owner == name and k in hparams}
    if name != "ppo" and "clip_eps" in hparams:
        args["clip_frac_eps"] = hparams["clip_eps"]  # it only set their clip_frac diagnostic
    return LEGACY_NAMES[name](**args)


def _saved_hparams(path: Any) -> dict[str, Any]:
    if not isinstance(path, (str, Path)) or not Path(path).is_file():
        return {}  # a remote or in-memory checkpoint: loaded as it is
    try:
        ckpt = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except RuntimeError:  # not a zip-format file (mmap needs one)
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return dict(ckpt.get("hyper_parameters") or {}) if isinstance(ckpt, dict) else {}


def legacy_load_kwargs(path: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Extra ``load_from_checkpoint`` arguments that load a checkpoint saved with the old settings:
    the objective it trained with, and an instantiator that drops the old keys. ``{}`` otherwise."""
    if "objective" in kwargs:
        return {}
    saved = _saved_hparams(path)
    objective = legacy_objective(saved)
    if objective is None:
        return {}
    # Lightning refuses an instantiator it does not trust and says to add it to this set; these two
    # only drop the old keys, then build the module as Lightning would.
    _ALLOWED_INSTANTIATORS.update({f"{__name__}.instantiate_cli", f"{__name__}.instantiate_plain"})
    if saved.get("_instantiator") == _CLI:
        return {"objective": objective.config(), "_instantiator": f"{__name__}.instantiate_cli"}
    return {"objective": objective, "_instantiator": f"{__name__}.instantiate_plain"}


def _without_legacy_keys(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k not in LEGACY_KEYS}


def instantiate_plain(cls: type, kwargs: dict[str, Any]) -> Any:
    """``cls(**kwargs)`` without the old objective settings (a module saved from Python)."""
    return cls(**_without_legacy_keys(kwargs))


def instantiate_cli(cls: type, kwargs: dict[str, Any]) -> Any:
    """LightningCLI's instantiator without the old objective settings (a module saved by the CLI)."""
    from lightning.pytorch.cli import instantiate_module

    return instantiate_module(cls, _without_legacy_keys(kwargs))
