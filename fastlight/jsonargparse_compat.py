"""Every use of a private jsonargparse API in fastlight, in one module.

A name with a leading underscore can change in any jsonargparse release. Each one here is used because no
public API does the job; :data:`CHECKED` is the release range they were checked against, and
tests/test_compat.py fails, naming this module, once the installed jsonargparse leaves it. After an upgrade,
re-read this module and run tests/test_cli_values.py, which exercises every name in it.

- ``jsonargparse._typehints.adapt_class_type`` and ``NestedArg`` (checked against 4.53.0): a flag two
  classes deep (``--model.policy.init_args.image_size null``) reaches the inner class's parser as
  ``f"--{key}={value}"`` of the value already read as YAML, so ``null`` arrives as the string ``'None'``.
  :func:`yaml_nested_values` hands it on as JSON (YAML) instead, so it arrives typed; the wrapper is in
  place only while fastlight's parser parses (:class:`fastlight.cli_parser.FastlightArgumentParser`).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from typing import Any

from jsonargparse import Namespace, _typehints

#: The jsonargparse releases the touches above were checked against: ``low <= version < high``.
CHECKED = ("4.53.0", "4.54")

_adapt_class_type = _typehints.adapt_class_type


@functools.wraps(_adapt_class_type)
def _typed_nested_values(value: Any, *args: Any, **kwargs: Any) -> Any:
    nested = value.get("init_args") if isinstance(value, Namespace) else None
    if isinstance(nested, _typehints.NestedArg) and not isinstance(nested.val, str):
        value["init_args"] = nested._replace(val=json.dumps(nested.val, default=str))
    return _adapt_class_type(value, *args, **kwargs)


@contextlib.contextmanager
def yaml_nested_values() -> Iterator[None]:
    """While inside: a command-line value two classes deep arrives as YAML reads it (module docstring)."""
    if _typehints.adapt_class_type is _typed_nested_values:  # a parse inside a parse: already in place
        yield
        return
    _typehints.adapt_class_type = _typed_nested_values
    try:
        yield
    finally:
        _typehints.adapt_class_type = _adapt_class_type
