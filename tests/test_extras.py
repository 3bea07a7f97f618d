"""Optional extras: the core install is the driving path; a missing extra is one line naming it.

A missing package is simulated with ``sys.modules[name] = None``, which makes ``import name``
raise ``ModuleNotFoundError`` exactly as an uninstalled package does.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastlight.cli_output import one_line_errors
from fastlight.extras import EXTRAS, MissingExtraError, check_extra, import_extra

ROOT = Path(__file__).resolve().parents[1]
METAWORLD_LINE = (
    r"^a Meta-World env \(fastlight/MetaWorld-\*\) needs the metaworld extra: "
    r"pip install 'fastlight\[metaworld\]' \(no module named 'metaworld'\)$"
)


def test_missing_metaworld_names_the_extra_when_the_env_is_built(monkeypatch):
    from fastlight.envs.registry import make_env

    monkeypatch.setitem(sys.modules, "metaworld", None)
    with pytest.raises(MissingExtraError, match=METAWORLD_LINE):
        make_env("fastlight/MetaWorld-reach-v3")


def test_missing_mujoco_names_the_metaworld_extra(monkeypatch):
    from fastlight.envs.rendering import _release_gl_context

    # Both names: an earlier test in the same process may have imported ``mujoco.egl`` already,
    # and a cached submodule is found without its parent package being imported again.
    monkeypatch.setitem(sys.modules, "mujoco", None)
    monkeypatch.setitem(sys.modules, "mujoco.egl", None)
    with pytest.raises(
        MissingExtraError, match=r"needs the metaworld extra: pip install 'fastlight\[metaworld\]'"
    ):
        _release_gl_context("egl")


def test_missing_transformers_names_the_vla_extra(monkeypatch):
    from fastlight.vla.policy import build_llama

    monkeypatch.setitem(sys.modules, "transformers", None)
    want = (
        r"^the VLA policy needs the vla extra: pip install 'fastlight\[vla\]' "
        r"\(no module named 'transformers'\)$"
    )
    with pytest.raises(MissingExtraError, match=want):
        build_llama(16, 8, 1, 2, 16)


def test_other_import_errors_are_not_taken_for_a_missing_extra():
    with pytest.raises(ModuleNotFoundError) as info:
        import_extra("fastlight.no_such_module", extra="vla", what="x")
    assert not isinstance(info.value, MissingExtraError)
    extras = r"\['bench', 'metaworld', 'ray', 'vla'\]"
    with pytest.raises(ValueError, match=rf"extra must be one of {extras}, got 'gpu'"):
        import_extra("json", extra="gpu", what="x")
    assert import_extra("mujoco", extra="metaworld", what="x").__name__ == "mujoco"  # installed here


def test_cli_prints_one_line_raw_or_wrapped(monkeypatch, capsys):
    """The CLI's error handler prints the line alone, whether the error arrives as itself or, as
    jsonargparse re-raises a failing class, inside a ValueError's text."""
    from fastlight.envs.registry import make_env

    monkeypatch.delenv("FASTLIGHT_DEBUG", raising=False)
    monkeypatch.setitem(sys.modules, "metaworld", None)
    with pytest.raises(SystemExit) as info, one_line_errors():
        make_env("fastlight/MetaWorld-reach-v3")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'fastlight[metaworld]'" in err[0], err


def test_pyproject_extras_match_and_core_is_the_driving_path():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:  # import names: stable-baselines3 imports as stable_baselines3
        return {r.split(">")[0].split("=")[0].split("[")[0].replace("-", "_") for r in reqs}

    extras = meta["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        assert names(extras[extra]) == set(modules), extra
    core = names(meta["dependencies"])
    assert {"highway_env", "gymnasium", "lightning", "torch"} <= core
    assert not core & {m for mods in EXTRAS.values() for m in mods}
    dev = next(r for r in extras["dev"] if r.startswith("fastlight["))
    assert set(dev.removeprefix("fastlight[").removesuffix("]").split(",")) == set(EXTRAS)


def test_check_extra_names_every_missing_module_and_the_extra(monkeypatch):
    real = importlib.util.find_spec
    gone = {"scipy", "pandas"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m in gone else real(m, *a))
    want = (
        r"^python -m benchmarks\.learning needs the bench extra: pip install 'fastlight\[bench\]' "
        r"\(no module named 'scipy', 'pandas'\)$"
    )
    with pytest.raises(MissingExtraError, match=want) as info:
        check_extra("scipy", "matplotlib", "pandas", extra="bench", what="python -m benchmarks.learning")
    assert info.value.name == "scipy"
    check_extra("matplotlib", "imageio", extra="bench", what="x")  # installed here: no error


def test_check_extra_refuses_modules_outside_the_extra():
    with pytest.raises(ValueError, match=r"\['torch'\] are not in the bench extra"):
        check_extra("torch", extra="bench", what="x")
    with pytest.raises(ValueError, match=r"extra must be one of .*, got 'plots'"):
        check_extra("matplotlib", extra="plots", what="x")


HIGHWAY_ONLY = """\
import sys
for name in ("metaworld", "mujoco"):  # as on a core install
    sys.modules[name] = None
from fastlight.cli import cli_main
cli_main(["fit", "--config", "configs/highway_dpsa.yaml", "--trainer.max_steps", "1",
          "--trainer.default_root_dir", sys.argv[1], "--trainer.enable_progress_bar", "false",
          "--data.num_workers", "1", "--data.num_envs", "2", "--data.max_horizon", "5",
          "--data.steps_per_epoch", "1"])
print("FIT DONE")
"""


@pytest.mark.slow
@pytest.mark.multiproc
def test_highway_fit_runs_without_metaworld_or_mujoco(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", HIGHWAY_ONLY, str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0 and "FIT DONE" in proc.stdout, proc.stderr[-3000:]
