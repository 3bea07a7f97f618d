"""Import paths of classes, compared by what they name, not by how they are spelt.

One class has several import paths (``fastlight.RLModule``, ``fastlight.modules.rl_module.RLModule``);
code that asks "is this entry that class?" resolves both sides.
"""

from __future__ import annotations

import importlib
from typing import Any


def class_path(cls: type) -> str:
    """``module.QualName`` of ``cls``: the path that works whatever the package exports."""
    return f"{cls.__module__}.{cls.__qualname__}"


def resolve(path: str) -> Any | None:
    """The object ``path`` (``pkg.module.Name``) names, or ``None`` where it does not import."""
    module, _, name = path.rpartition(".")
    if not module:
        return None
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        parent = resolve(module)  # a nested name, e.g. pkg.module.Outer.Inner
        return None if parent is None else getattr(parent, name, None)


def same_class(a: str | None, b: str | None) -> bool:
    """``a`` and ``b`` name the same object (equal strings do, without importing anything)."""
    if a is None or b is None:
        return False
    if a == b:
        return True
    found = resolve(a)
    return found is not None and found is resolve(b)


def class_key(path: str) -> Any:
    """A dict key under which every spelling of one class meets (the class itself, or the
    string when it does not import)."""
    found = resolve(path)
    return found if found is not None else path
