"""Each compat module names the release range its private touches of a library were checked against; a
library installed outside that range fails here, naming the module to re-read, before anything else does."""

from __future__ import annotations

from importlib import metadata
from types import ModuleType

import pytest
from packaging.version import Version

from fastlight import jsonargparse_compat, lightning_compat
from fastlight.vla import transformers_compat


def outside(module: ModuleType, dist: str, installed: str) -> str | None:
    """Why ``installed`` (a version of ``dist``) is not one ``module``'s touches were checked against."""
    low, high = module.CHECKED
    if Version(low) <= Version(installed) < Version(high):
        return None
    return (
        f"{dist} {installed} is outside {low} <= version < {high}, the releases {module.__name__}'s private "
        f"touches were checked against: re-read every touch listed in {module.__file__}, run the tests its "
        "docstring names, then widen CHECKED"
    )


@pytest.mark.parametrize(
    "module, dist",
    [
        (lightning_compat, "lightning"),
        (jsonargparse_compat, "jsonargparse"),
        (transformers_compat, "transformers"),
    ],
)
def test_installed_release_is_one_the_private_touches_were_checked_against(module, dist):
    problem = outside(module, dist, metadata.version(dist))
    assert problem is None, problem


def test_a_release_outside_the_range_is_named():
    assert outside(jsonargparse_compat, "jsonargparse", "4.53.0") is None
    line = outside(jsonargparse_compat, "jsonargparse", "4.54.1")
    assert line is not None and "jsonargparse 4.54.1 is outside 4.53.0 <= version < 4.54" in line
    assert "fastlight.jsonargparse_compat" in line
    assert outside(lightning_compat, "lightning", "2.5.9") is not None
