"""The public face: ``fastlight.<Name>`` for every class a user names, loaded lazily, typo-safe."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fastlight


@pytest.mark.parametrize("name", fastlight.__all__)
def test_every_public_name_is_the_defining_class(name: str) -> None:
    value = getattr(fastlight, name)
    assert value.__name__ == name and value.__module__ == fastlight._EXPORTS[name]


def test_a_misspelt_name_fails_naming_it() -> None:
    with pytest.raises(AttributeError, match="'RLModul'.*RLModule"):
        _ = fastlight.RLModul  # type: ignore[attr-defined]


def test_import_fastlight_loads_no_lightning() -> None:
    # A sampler process imports fastlight.sampling.*: the package's own __init__ must not pull in
    # Lightning and every module (the names load on first use).
    code = "import sys, fastlight; print('lightning' in sys.modules, 'fastlight.modules' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_callbacks_package_exports_every_callback() -> None:
    import fastlight.callbacks as cbs

    for name in cbs.__all__:
        assert getattr(fastlight, name) is getattr(cbs, name)
    assert set(cbs.__all__) <= set(fastlight.__all__)
