"""The ``fastlight`` command line's parser: refusals as one line, and the dumped config the run's own.

A command line jsonargparse refuses is raised as a :class:`~fastlight.cli_output.SettingError` whose
message is jsonargparse's own, on one line. A dumped config is the run's complete one
(:func:`fastlight.cli_defaults.complete_run_config`). A command-line value means what it means in YAML
at every depth; a later ``--config`` file's ``env_kwargs`` update the earlier ones key by key.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, NoReturn

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser

from fastlight.cli_defaults import complete_run_config
from fastlight.cli_output import SettingError, parse_error_line
from fastlight.fleet.start import config_files
from fastlight.jsonargparse_compat import yaml_nested_values

#: LightningCLI's optimizer arguments, which fastlight's CLI does not have (the module makes its optimizer).
_OPTIMIZER_FLAGS = ("--optimizer", "--lr_scheduler")


def optimizer_line(flag: str) -> str:
    """The refusal of ``--optimizer`` / ``--lr_scheduler``: what sets the optimizer instead."""
    return (
        f"{flag} is not a setting: the module makes its optimizer (fastlight.RLModule: Adam at --model.lr "
        "over param_groups()); set --model.lr, or override param_groups() (which parameters, a learning rate "
        "per group) or configure_optimizers() (another optimizer, a scheduler) in a subclass"
    )


def check_command_line(args: Sequence[str]) -> None:
    """Refuse what the command line asks that jsonargparse would only call unrecognized: an optimizer
    flag of LightningCLI's, a ``--config`` file that is missing or not YAML."""
    for arg in args:
        flag = str(arg).split("=", 1)[0].removesuffix("+")
        if flag in _OPTIMIZER_FLAGS or flag.startswith(tuple(f"{f}." for f in _OPTIMIZER_FLAGS)):
            raise SettingError(optimizer_line(flag.split(".", 1)[0]))
    check_config_files(args)


def check_config_files(args: Sequence[str]) -> None:
    """Refuse a ``--config`` file that is missing or not YAML, naming it (jsonargparse would not)."""
    import yaml

    for value in config_files(args):
        path = Path(value)
        if not path.is_file():
            if path.exists():
                raise SettingError(f"--config {value}: not a file")
            try:  # jsonargparse also takes the config itself: --config '{trainer: {max_steps: 3}}'
                inline = yaml.safe_load(value)
            except yaml.YAMLError:
                inline = None
            if isinstance(inline, dict):
                continue
            raise SettingError(f"--config {value}: no such file")
        try:
            yaml.safe_load(path.read_text())
        except OSError as e:
            raise SettingError(f"--config {value}: {e.strerror or e}") from e
        except UnicodeDecodeError as e:
            raise SettingError(f"--config {value}: not a YAML file (not UTF-8 text: byte {e.start})") from e
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
            problem = getattr(e, "problem", None) or " ".join(str(e).split())
            raise SettingError(f"--config {value}: {where}{problem}") from e


def check_init_from(config: Namespace) -> None:
    """Refuse a ``--model.init_from`` file that does not exist, before the data module and the
    Trainer start; not checked on a resume (``--ckpt_path``), which does not read it."""
    sub = config.get("subcommand")
    cfg = config[sub] if sub else config
    if cfg.get("ckpt_path"):
        return
    init_from = cfg.get("model.init_args.init_from") if cfg.get("model.init_args") else None
    if init_from and isinstance(init_from, str | os.PathLike) and not Path(init_from).is_file():
        raise FileNotFoundError(f"--model.init_from: no checkpoint file at {init_from}")


#: Set while a ``--config`` file is being applied (its ``env_kwargs`` then update the earlier ones).
_IN_CONFIG_FILE: ContextVar[bool] = ContextVar("fastlight_in_config_file", default=False)


def _merged(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """``later`` over ``earlier``, key by key at every depth."""
    out = dict(earlier)
    for key, value in later.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


#: ``--model.objective.help GIPO``: jsonargparse prints a class's help two levels deep from the inner
#: class's parser, as ``--objective.sigma``, which the command line refuses. Inner key -> the flag's prefix.
_NESTED_HELP: ContextVar[dict[str, str] | None] = ContextVar("fastlight_nested_help", default=None)


def note_nested_help(args: Sequence[str]) -> None:
    """Record the prefix of each nested ``--<group>.<key>.help`` flag of ``args`` (:data:`_NESTED_HELP`)."""
    prefixes = {}
    for arg in args:
        parts = str(arg).split("=", 1)[0].removeprefix("--").split(".")
        if str(arg).startswith("--") and len(parts) >= 3 and parts[-1] == "help":
            prefixes[parts[-2]] = ".".join(p for p in parts[:-1] if p != "init_args")
    _NESTED_HELP.set(prefixes)


class FastlightArgumentParser(LightningArgumentParser):
    def add_class_arguments(
        self, theclass: Any, nested_key: str | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        prefix = (_NESTED_HELP.get() or {}).get(nested_key or "")
        if prefix and str(self.description).startswith(f"Help for --{nested_key}.help"):
            nested_key = prefix  # the help's flags as the command line takes them: --model.objective.sigma
        return super().add_class_arguments(theclass, nested_key, *args, **kwargs)

    def parse_args(self, *args: Any, **kwargs: Any) -> Namespace:
        with yaml_nested_values():
            return super().parse_args(*args, **kwargs)

    def parse_path(self, *args: Any, **kwargs: Any) -> Namespace:
        token = _IN_CONFIG_FILE.set(True)
        try:
            return super().parse_path(*args, **kwargs)
        finally:
            _IN_CONFIG_FILE.reset(token)

    def parse_object(self, obj: Any, namespace: Namespace | None = None, **kwargs: Any) -> Namespace:
        # jsonargparse replaces a dict a later file sets whole, dropping the earlier keys without a word.
        if _IN_CONFIG_FILE.get() and isinstance(namespace, Namespace) and isinstance(obj, Namespace):
            earlier, later = namespace.get("env_kwargs"), obj.get("env_kwargs")
            if isinstance(earlier, dict) and isinstance(later, dict):
                obj = obj.clone()
                obj["env_kwargs"] = _merged(earlier, later)
        return super().parse_object(obj, namespace, **kwargs)

    def dump(self, namespace: Namespace, *args: Any, **kwargs: Any) -> str:
        # Completing a config the CLI already completed changes nothing (e.g. the saved config.yaml).
        return super().dump(complete_run_config(namespace), *args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        # The parsers jsonargparse nests for a class do not exit on error: their report goes up, into
        # the command's own parser's, which raises it as one line.
        message = self._with_suggestion(message)
        if not self.exit_on_error:
            super().error(message, ex)
        raise SettingError(parse_error_line(message, ex)) from ex

    def _with_suggestion(self, message: str) -> str:
        """``message`` with the closest setting this parser knows when it refuses an unknown one (a
        typo: ``--data.termination_treshold``, ``--model.learning_rate``)."""
        unknown = re.search(r"Option '([\w.]+)' is not accepted|unrecognized arguments: --([\w.]+)", message)
        if unknown is None:
            return message
        name = unknown[1] or unknown[2]
        known = {s.lstrip("-") for a in self._actions for s in (a.dest, *a.option_strings) if s != "help"}
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
        return f"{message} (did you mean {close[0]}?)" if close else message
