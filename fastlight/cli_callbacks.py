"""Callbacks in a ``fastlight`` config: one entry per callback class, whatever the fragments add.

A fragment in ``callbacks/`` appends its callback; a second instance of a callback the experiment
already has would be refused by Lightning (one ``state_key``) or run twice, so
:func:`merge_repeated_callbacks` folds it into the first entry instead.
"""

from __future__ import annotations

import inspect
from typing import Any

from jsonargparse import Namespace

# Imported so that jsonargparse resolves their bare names (--trainer.callbacks+=RolloutThroughput).
import fastlight.callbacks.dwr  # noqa: F401
import fastlight.callbacks.env_steps  # noqa: F401
import fastlight.callbacks.progress  # noqa: F401
import fastlight.callbacks.throughput  # noqa: F401
import fastlight.callbacks.weight_sync  # noqa: F401
from fastlight.class_paths import class_key

#: Callbacks whose several instances are meaningful (their state key includes their arguments).
MAY_REPEAT = frozenset(
    {"lightning.pytorch.callbacks.ModelCheckpoint", "lightning.pytorch.callbacks.EarlyStopping"}
)


def merge_repeated_callbacks(callbacks: list[Any] | None) -> list[Any] | None:
    """Fold entries with a repeated ``class_path`` into the first one: the later entry's ``init_args``
    that differ from the constructor's defaults win, key by key. Callback objects are kept as they are.
    Returns a new list; the order of first entries is kept."""
    if not callbacks:
        return callbacks
    merged: list[Any] = []
    first: dict[Any, Any] = {}  # keyed by the class, so that two spellings of one path meet
    may_repeat = {class_key(p) for p in MAY_REPEAT}
    for cb in callbacks:
        path = cb.get("class_path") if isinstance(cb, Namespace) else None
        key = None if path is None else class_key(path)
        if key is None or key in may_repeat:
            merged.append(cb)
            continue
        if key not in first:
            first[key] = cb
            merged.append(cb)
            continue
        kept = init_args(first[key])
        defaults = constructor_defaults(class_key(path))
        for key, value in vars(cb.get("init_args") or Namespace()).items():
            if key not in defaults or value != defaults[key]:
                kept[key] = value
    return merged


def init_args(cb: Namespace) -> Namespace:
    """``cb``'s ``init_args``, an empty one set first where it has none."""
    if cb.get("init_args") is None:
        cb["init_args"] = Namespace()
    return cb["init_args"]


def constructor_defaults(cls: type) -> dict[str, Any]:
    """The default argument values of ``cls``'s constructor."""
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
