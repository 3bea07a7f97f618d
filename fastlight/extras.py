"""Optional extras: the core install is the driving path; the rest comes with an extra.

- core (``pip install fastlight``): highway-env driving, gymnasium ids, MLP policies, the CLI;
- ``fastlight[metaworld]``: Meta-World MT10 envs (``metaworld``, ``mujoco``, and ``tokenizers`` for
  their instructions);
- ``fastlight[vla]``: the VLA policy and instruction tokenizer (``transformers``, ``tokenizers``,
  ``safetensors``) and its LoRA adapters (``peft``);
- ``fastlight[ray]``: the Ray fleet, samplers as Ray actors on the nodes of a cluster (``ray``);
- ``fastlight[bench]``: ``fastlight plot``, ``fastlight evaluate --video`` and the benchmarks
  (``python -m benchmarks.<study>``: plots, statistics, reports, the Stable-Baselines3 peer).

Code that needs an extra imports it through :func:`import_extra` at the point of use, so a missing one
is one line naming the extra to install; :func:`check_extra` checks up front without importing.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

#: Extra -> the top-level modules it provides (pyproject.toml's [project.optional-dependencies]).
EXTRAS: dict[str, tuple[str, ...]] = {
    "metaworld": ("metaworld", "mujoco", "tokenizers"),
    "vla": ("transformers", "tokenizers", "safetensors", "peft"),
    "bench": ("matplotlib", "pandas", "scipy", "rliable", "imageio", "stable_baselines3"),
    "ray": ("ray",),
}


class MissingExtraError(ModuleNotFoundError):
    """An optional package is not installed; the message names the extra that installs it."""


def import_extra(module: str, *, extra: str, what: str) -> ModuleType:
    """``importlib.import_module(module)``, or :class:`MissingExtraError` (naming the feature ``what``) if
    ``extra`` is not installed; an import error of some other package propagates unchanged."""
    if extra not in EXTRAS:
        raise ValueError(f"import_extra: extra must be one of {sorted(EXTRAS)}, got {extra!r}")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if (e.name or "").split(".")[0] not in EXTRAS[extra]:
            raise
        raise MissingExtraError(
            f"{what} needs the {extra} extra: pip install 'fastlight[{extra}]' (no module named {e.name!r})",
            name=e.name,
        ) from None


def check_extra(*modules: str, extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` if any of ``modules`` (of ``extra``, else ``ValueError``) is not
    installed, without importing them."""
    if extra not in EXTRAS:
        raise ValueError(f"check_extra: extra must be one of {sorted(EXTRAS)}, got {extra!r}")
    if unknown := [m for m in modules if m not in EXTRAS[extra]]:
        raise ValueError(f"check_extra: {unknown} are not in the {extra} extra {EXTRAS[extra]}")
    if missing := [m for m in modules if importlib.util.find_spec(m) is None]:
        names = ", ".join(repr(m) for m in missing)
        raise MissingExtraError(
            f"{what} needs the {extra} extra: pip install 'fastlight[{extra}]' (no module named {names})",
            name=missing[0],
        )
