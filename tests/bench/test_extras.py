"""The bench extra: a missing optional package is named with the extra that installs it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fastlight.bench import extras
from fastlight.bench.extras import BENCH_PACKAGES, require

ROOT = Path(__file__).resolve().parents[2]


def test_missing_package_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda m: None if m == "scipy" else real(m))
    want = r"bench\.learning needs scipy, .*pip install 'fastlight\[bench\]'"
    with pytest.raises(ModuleNotFoundError, match=want):
        require("scipy", "matplotlib", command="python -m fastlight.bench.learning")
    require("matplotlib", command="x")  # present: no error


def test_only_bench_packages_can_be_required():
    with pytest.raises(ValueError, match=r"\['torch'\] are not in the bench extra"):
        require("torch", command="x")


def test_bench_extra_declares_exactly_the_checked_packages():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {
        d.split(">")[0].split("=")[0].split("[")[0].replace("-", "_")
        for d in meta["optional-dependencies"]["bench"]
    }
    assert declared == set(BENCH_PACKAGES)
    core = {d.split(">")[0].split("=")[0].split("[")[0] for d in meta["dependencies"]}
    assert not core & declared  # benchmark-only packages stay out of the core install
