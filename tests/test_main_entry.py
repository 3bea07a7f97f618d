"""The console script sets MuJoCo's GL backend before anything (forkserver, evaluate, plot) starts."""

from __future__ import annotations

import os
import sys

import pytest

from fastlight.__main__ import main


def test_console_script_sets_mujoco_gl_first(monkeypatch) -> None:
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.setattr(sys, "argv", ["fastlight", "plot", "--help"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 0 and os.environ["MUJOCO_GL"] == "egl"


def test_a_users_choice_of_backend_is_kept(monkeypatch) -> None:
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    monkeypatch.setattr(sys, "argv", ["fastlight", "plot", "--help"])
    with pytest.raises(SystemExit):
        main()
    assert os.environ["MUJOCO_GL"] == "osmesa"
