"""``fastlight fit --model.help`` / ``--data.help`` / ``--print_config``: every setting is findable.

Short class names resolve for fastlight's modules and data modules, every constructor argument has
a description in help (as jsonargparse reads the docstring: an ``Args:`` entry naming several
arguments at once describes none of them), the RLModule help lists fastlight's policies rather
than every ``torch.nn`` class, and ``--print_config`` shows the callbacks, loggers and folders the
command adds before the run starts.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from jsonargparse._parameter_resolvers import get_signature_parameters
from lightning.pytorch.callbacks import Callback

import fastlight.callbacks
from fastlight.data.datamodule import RolloutDataModule
from fastlight.envs.scenario_cost import ScenarioLoadCost
from fastlight.fleet.faults import FaultSettings
from fastlight.inference.settings import InferenceSettings
from fastlight.modules.objectives import GIPO, SAPO, PPOClip
from fastlight.modules.rl_module import RLModule
from fastlight.vla.demos import DemoDataModule
from fastlight.vla.module import VLAModule
from fastlight.vla.sft import VLASFTModule

ROOT = Path(__file__).resolve().parents[1]
FASTLIGHT = ROOT / ".venv" / "bin" / "fastlight"  # the console script users run
CALLBACKS = [getattr(fastlight.callbacks, name) for name in fastlight.callbacks.__all__]
#: Every class whose constructor arguments are CLI settings (--model.*, --data.*, their settings
#: objects, --trainer.callbacks+=...).
SETTINGS = [
    RLModule, VLAModule, VLASFTModule, RolloutDataModule, DemoDataModule, InferenceSettings,
    FaultSettings, ScenarioLoadCost, PPOClip, GIPO, SAPO, *CALLBACKS,
]  # fmt: skip


def undocumented(cls: type) -> list[str]:
    """``cls``'s constructor arguments without a description, as jsonargparse (help) reads them."""
    return [p.name for p in get_signature_parameters(cls, "__init__") if not (p.doc or "").strip()]


def test_every_callback_of_fastlight_is_checked():
    defined = {
        cls
        for info in pkgutil.iter_modules(fastlight.callbacks.__path__)
        for cls in vars(importlib.import_module(f"fastlight.callbacks.{info.name}")).values()
        if isinstance(cls, type) and issubclass(cls, Callback) and cls.__module__.startswith("fastlight.")
    }
    assert len(defined) >= 7 and defined <= set(CALLBACKS), defined - set(CALLBACKS)


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda c: c.__name__)
def test_every_setting_has_a_description(cls):
    assert get_signature_parameters(cls, "__init__"), cls  # the reader found the arguments at all
    assert undocumented(cls) == []


def test_an_entry_naming_two_arguments_describes_neither():
    """What the check catches: docstring_parser reads ``a, b: ...`` as no entry of ``a`` or ``b``."""

    class Combined:
        def __init__(self, a: int = 0, b: int = 0, c: int = 0) -> None:
            """Sizes.

            Args:
                a, b: two sizes.
                c: a third.
            """

    class Unindented:
        def __init__(self, a: int = 0) -> None:
            """Args:
            a: a size.
            """

    class Split:
        def __init__(self, a: int = 0, b: int = 0) -> None:
            """Sizes.

            Args:
                a: the first size.
                b: the second size.
            """

    assert undocumented(Combined) == ["a", "b"]
    assert undocumented(Unindented) == ["a"]  # an Args block that starts the docstring is no block
    assert undocumented(Split) == []


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [str(FASTLIGHT), *args], capture_output=True, text=True, cwd=ROOT, timeout=180, env=env
    )


def option_help(text: str, flag: str) -> str:
    """The description of ``flag`` (an int or float setting) in argparse help ``text``."""
    lines = text.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith(f"  {flag} ")]
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if line.startswith("  --") or not line.strip():
            break
        block.append(line)
    words = " ".join(line.strip() for line in block)
    words = words.removeprefix(f"{flag} {flag.rsplit('.', 1)[-1].upper()}")  # the option and its metavar
    return words.split("(type:")[0].strip()


def test_rl_module_help_is_short_and_lists_fastlights_policies():
    out = run("fit", "--model.help", "RLModule")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) < 150, len(lines)
    assert "torch.nn." not in out.stdout
    assert "fastlight.MLPActorCritic" in out.stdout and "fastlight.VLAPolicy" in out.stdout
    for name in ("gamma", "gae_lambda", "obs_dim", "action_dim", "update_epochs", "num_minibatches"):
        assert option_help(out.stdout, f"--model.{name}"), name


def test_short_names_of_modules_and_data_modules_resolve():
    """In a fresh process, as the command runs: nothing but the CLI has imported the classes."""
    code = (
        "import sys\n"
        "from fastlight.cli import cli_main\n"
        "for flag, name in [a.split('=') for a in sys.argv[1:]]:\n"
        "    print('=== ' + name, flush=True)\n"
        "    try:\n"
        "        cli_main(['fit', flag, name])\n"
        "    except SystemExit as e:\n"
        "        print(f'=== exit {e.code}', flush=True)\n"
    )
    asked = {
        "RolloutDataModule": "--data.help",
        "DemoDataModule": "--data.help",
        "VLAModule": "--model.help",
        "VLASFTModule": "--model.help",
    }
    out = subprocess.run(
        [sys.executable, "-c", code, *(f"{flag}={name}" for name, flag in asked.items())],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    sections = out.stdout.split("=== ")[1:]
    assert len(sections) == 2 * len(asked), out.stdout[-2000:] + out.stderr[-2000:]
    pairs = list(zip(sections[::2], sections[1::2], strict=True))
    for (name, flag), (head, tail) in zip(asked.items(), pairs, strict=True):
        assert head.startswith(name) and tail.strip() == "exit 0", (name, out.stderr[-2000:])
        assert f"Help for {flag}=fastlight.{name}" in head, name
    assert "--data.num_envs" in sections[0] and "--data.demos_per_task" in sections[2]
    assert "--model.sil_steps" in sections[4] and "--model.label_smoothing" in sections[6]


def test_print_config_shows_the_callbacks_loggers_and_folders_the_command_adds(tmp_path):
    root = tmp_path / "run"
    config = str(ROOT / "configs" / "highway_dpsa.yaml")
    out = run("fit", "--config", config, "--trainer.default_root_dir", str(root), "--print_config")
    assert out.returncode == 0, out.stderr
    trainer = yaml.safe_load(out.stdout)["trainer"]
    assert trainer["logger"] == [
        {
            "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
            "init_args": {"save_dir": str(root), "name": "tb", "version": 0},
        },
        {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": str(root), "name": "csv", "version": 0},
        },
    ]
    callbacks = {cb["class_path"].rsplit(".", 1)[-1]: cb["init_args"] for cb in trainer["callbacks"]}
    added = ["PreemptionCheckpoint", "LostRankCheckpoint", "EnvStepBudget"]
    assert list(callbacks) == ["ModelCheckpoint", "RolloutThroughput", *added]  # the config's, then the CLI's
    assert callbacks["ModelCheckpoint"]["dirpath"] == str(root / "checkpoints" / "version_0")
    assert callbacks["PreemptionCheckpoint"] == {
        "dirpath": str(root / "checkpoints"),
        "filename": "last",
        "every_minutes": 30.0,
        "handle_signals": True,
        "version": 0,
        "every_epoch": False,
    }
    assert callbacks["LostRankCheckpoint"] == {
        "peer_timeout_minutes": 5.0,
        "rollback": False,
        "sharded_every_minutes": 5.0,
    }
    assert callbacks["EnvStepBudget"]["total_env_steps"] is None
    assert not root.exists()  # printing the config creates no folder


def test_fit_help_says_first_where_fastlights_settings_are():
    out = run("fit", "--help")
    assert out.returncode == 0, out.stderr
    head = " ".join(" ".join(out.stdout.splitlines()[:10]).split())  # the help wraps its lines
    assert head.startswith("usage: fastlight [options] fit [--config FILE ...]"), head
    assert "--model.* and --data.* groups" in head and "--model.help RLModule" in head, head
    # The groups carry fastlight's own description, not Lightning's base classes' docstrings.
    text = " ".join(out.stdout.split())
    assert "fastlight's RL module (--model.class_path fastlight.RLModule" in text
    assert "fastlight's data module (--data.class_path fastlight.RolloutDataModule" in text


def test_a_nested_help_prints_flags_that_paste():
    """``--model.objective.help GIPO`` is printed by RLModule's own parser: its flags carry the outer prefix,
    as the command line takes them (tests/test_cli_values.py parses them)."""
    out = run("fit", "--model.objective.help", "GIPO")
    assert out.returncode == 0, out.stderr
    assert "  --model.objective.sigma SIGMA" in out.stdout, out.stdout
    assert "  --objective." not in out.stdout


def test_top_level_help_lists_the_three_commands():
    out = run("--help")
    assert out.returncode == 0, out.stderr
    commands = [line.split()[0] for line in out.stdout.splitlines() if line[:2] == "  " and line[2:3] != " "]
    assert commands == ["fit", "evaluate", "plot"], out.stdout
    assert "validate" not in out.stdout  # an RL module has no validation loop (one line says so)
    bare = run()
    assert bare.returncode == 2 and bare.stderr.startswith("usage: fastlight {fit,evaluate,plot}")
