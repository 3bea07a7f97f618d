"""The ``fastlight`` command line's refusals, each as one line naming the flag.

jsonargparse reports a bad command line as a nested, many-line message (a union of a class and
``None``, the class's own parser inside, the failed check at the bottom). :func:`argument_error_line`
reads the exception chain under that message (each level's parser key, the class named in the
config, the check that failed) and says it in one line, which the CLI raises as a
:class:`~fastlight.cli_output.SettingError` (printed by :func:`fastlight.cli_output.one_line_errors`):

- a value outside a ``Literal``: ``--data.reset_mode must be one of dpsa | sgr | autoreset |
  sequential, got 'foo'``; a value of the wrong type: ``--data.num_envs must be an int, got 'four'``;
- an old flat data setting that moved into a settings object: ``--data.heartbeat_s has moved:
  write --data.faults.heartbeat_s`` (:mod:`fastlight.data.legacy`);
- a setting the class does not have: ``--model.learning_rate is not a setting of fastlight.RLModule;
  did you mean --model.lr?`` (likewise ``--trainer.*`` against the Trainer's arguments);
- ``--optimizer`` / ``--lr_scheduler``: the module makes its optimizer (:func:`optimizer_line`);
- a callback class that does not resolve (:func:`callback_line`).

:func:`check_config_files` refuses a missing or malformed ``--config`` file before jsonargparse
reads it, naming the file (and the line and column of a YAML mistake); :func:`check_init_from`
refuses a missing ``--model.init_from`` checkpoint before anything starts.

A dumped config is the run's complete one (:func:`fastlight.cli_defaults.complete_run_config`), so
that ``--print_config``, which jsonargparse prints from inside parsing, before the CLI adds its
callbacks, loggers and folders, shows what will run.
"""

from __future__ import annotations

import ast
import os
import re
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn, Union, get_args, get_origin

from jsonargparse import ArgumentParser, Namespace
from lightning.pytorch.cli import LightningArgumentParser

from fastlight.class_paths import resolve
from fastlight.cli_defaults import complete_run_config
from fastlight.cli_output import SettingError, closest
from fastlight.data.legacy import MOVED, moved_line

_KEY = re.compile(r'Parser key "([^"]+)"')
_LITERAL = re.compile(r"Expected a typing\.Literal\[([^\]]*)\]")
#: The refused value: "Got value: foo", or for an optional Literal the inner "Given value: foo".
_GOT = re.compile(r"(?:Got|Given) value: (?!NestedArg)(.*)")
_UNKNOWN = re.compile(r"""(?:Option|Key|key) ["']([^"']+)["'] (?:is not accepted|is not expected)""")


def parser_error_line(message: str) -> str | None:
    """The one line for jsonargparse error ``message``, or None when it is not one of the two kinds."""
    keys = [k for k in _KEY.findall(message) if k != "init_args"]
    unknown = _UNKNOWN.search(message)
    if unknown is not None and keys[:1] == ["data"]:
        name = unknown.group(1).split(".")[-1]
        if name in MOVED:
            return moved_line(name)
    literal, got = _LITERAL.search(message), _GOT.search(message)
    if literal is None or got is None or not keys:
        return None
    try:
        allowed = ast.literal_eval(f"({literal.group(1)},)")
    except (ValueError, SyntaxError):
        return None
    flag = "--" + ".".join(keys)
    null = "null or " if f"typing.Literal[{literal.group(1)}], <class 'NoneType'>" in message else ""
    values = " | ".join(str(a) for a in allowed)
    return f"{flag} must be {null}one of {values}, got {got.group(1).strip()!r}"


#: A level of jsonargparse's report: the key it was parsing, the class it was building.
_KEY_AT_START = re.compile(r'Parser key "([^"]+)":')
_CLASS = re.compile(r"Problem with given class_path '([^']+)':")
#: A top-level key a config file holds that the command does not have.
_NOT_ACCEPTED = re.compile(r"does not accept option '([^']+)'")
_UNRECOGNIZED = "unrecognized arguments: "
#: LightningCLI's optimizer arguments, which fastlight's CLI does not have (the module makes its optimizer).
_OPTIMIZER_KEYS = ("optimizer", "lr_scheduler")


def optimizer_line(name: str) -> str:
    """The refusal of ``--optimizer`` / ``--lr_scheduler``: what sets the optimizer instead."""
    return (
        f"--{name} is not a setting: the module makes its optimizer (fastlight.RLModule: Adam at --model.lr "
        "over param_groups()); set --model.lr, or override param_groups() (which parameters, a learning rate "
        "per group) or configure_optimizers() (another optimizer, a scheduler) in a subclass"
    )


def callback_line(name: str) -> str:
    """The refusal of a callback class that does not resolve, listing fastlight's."""
    from lightning.pytorch import callbacks as lightning_callbacks

    from fastlight import callbacks

    ours = list(callbacks.__all__)
    close = closest(name, ours + [c for c in lightning_callbacks.__all__ if c != "Callback"])
    hint = f" (did you mean {close}?)" if close else ""
    return (
        f"--trainer.callbacks: no callback class {name}{hint}; fastlight's: {', '.join(ours)}, "
        "or a full import path like lightning.pytorch.callbacks.ModelCheckpoint"
    )


@dataclass
class _Report:
    """What jsonargparse's chain of exceptions says, outermost level first."""

    keys: list[str] = field(default_factory=list)  #: the flag's parts: ["data", "num_envs"]
    class_path: str | None = None  #: the innermost class being built (as the config names it)
    rest: list[str] = field(default_factory=list)  #: the keys after that class: ["num_envs"]
    check: str = ""  #: the message of the check that failed (the innermost exception)
    value: str | None = None  #: the refused value, as given


def _report(error: BaseException) -> _Report:
    from fastlight.cli_output import exception_chain

    report, last = _Report(), None
    for exc in exception_chain(error):
        message = str(exc)
        if message == last:  # jsonargparse re-raises one error under several types
            continue
        last = message
        key = _KEY_AT_START.match(message)
        if key is not None:
            names = [k for k in key.group(1).split(".") if k != "init_args"]
            report.keys += names
            report.rest += names
        cls = _CLASS.match(message)
        if cls is not None:
            report.class_path, report.rest = cls.group(1), []
        got = _GOT.search(message)
        if got is not None:
            report.value = got.group(1).strip()
        report.check = message
    return report


def _class_settings(class_path: str) -> ArgumentParser | None:
    """A parser of ``class_path``'s constructor, as jsonargparse reads it (what it accepts)."""
    cls = resolve(class_path)
    if not isinstance(cls, type):
        return None
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, fail_untyped=False)
    return parser


def _settings(parser: ArgumentParser) -> list[str]:
    """The keys ``parser`` accepts (``lr``, ``faults.heartbeat_s``; ``trainer.max_steps``)."""
    skip = ("help", "config")
    return [a.dest for a in parser._actions if a.dest not in skip and not a.dest.endswith(".help")]


def describe(hint: Any) -> str:
    """A type hint in the words of an error line: ``Union[bool, int]`` -> ``an int or true/false``."""
    words = {int: "an int", float: "a float", bool: "true/false", str: "a string", type(None): "null"}
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        # null first, true/false last: "an int or true/false", "null or one of spawn | forkserver"
        parts = sorted(get_args(hint), key=lambda a: (a is not type(None), a is bool))
        values = [v for a in parts if get_origin(a) is Literal for v in get_args(a)]
        others = [a for a in parts if get_origin(a) is not Literal]
        if values:  # several Literals (the Trainer's precision): one list of values
            others.insert(len(others) - others.count(bool), Literal[tuple(dict.fromkeys(values))])
        return " or ".join(describe(a) for a in others)
    if origin is Literal:
        return "one of " + " | ".join(str(a) for a in get_args(hint))
    if hint in words:
        return words[hint]
    if origin in (list, tuple, Sequence) or hint in (list, tuple):
        return "a list"
    if origin is dict or hint is dict:
        return "a mapping"
    return getattr(hint, "__name__", str(hint))


def _typehint(report: _Report, parser: ArgumentParser) -> Any:
    owner = _class_settings(report.class_path) if report.class_path else parser
    keys = report.rest if report.class_path else report.keys
    action = owner._option_string_actions.get("--" + ".".join(keys)) if owner is not None else None
    return getattr(action, "_typehint", None)


def _unknown_line(report: _Report, name: str, parser: ArgumentParser) -> str:
    if not report.keys and name in _OPTIMIZER_KEYS:
        return optimizer_line(name)
    prefix = "--" + "".join(f"{k}." for k in report.keys)
    owner = _class_settings(report.class_path) if report.class_path else None
    if owner is not None:
        within = "".join(f"{k}." for k in report.rest)
        accepted = [k[len(within) :] for k in _settings(owner) if k.startswith(within)]
        what = report.class_path
    else:
        accepted = [k for k in _settings(parser) if "." not in k]
        what = "the command"
    close = closest(name, accepted)
    hint = f"did you mean {prefix}{close}?" if close else f"its settings: {', '.join(accepted)}"
    return f"{prefix}{name} is not a setting of {what}; {hint}"


def _unrecognized_line(report: _Report, parser: ArgumentParser) -> str:
    """argparse's "unrecognized arguments: --trainer.max_stpes 2": the command's own keys (or, inside
    a class's settings, ``--data.faults.heartbeet_s``, that class's) hold the one meant."""
    tokens = report.check[len(_UNRECOGNIZED) :].split()
    token = next((t for t in tokens if t.startswith("-")), None)
    if token is None:
        return f"unexpected argument {' '.join(tokens)!r} (a setting is --key value)"
    key = token.split("=", 1)[0].removesuffix("+").lstrip("-")
    if not report.keys and key in _OPTIMIZER_KEYS:
        return optimizer_line(key)
    owner = _class_settings(report.class_path) if report.class_path else None
    group, _, name = key.rpartition(".")
    options = _settings(owner if owner is not None else parser)
    within = f"{group}." if group else ""
    accepted = [o[len(within) :] for o in options if o.startswith(within) and "." not in o[len(within) :]]
    prefix = "--" + "".join(f"{k}." for k in report.keys) + within
    if owner is not None:
        what = report.class_path
    else:
        what = "the Trainer" if group == "trainer" else f"--{group}" if group else "the command"
    close = closest(name, accepted)
    hint = f"; did you mean {prefix}{close}?" if close else ""
    return f"{prefix}{name} is not a setting of {what}{hint}"


def argument_error_line(error: BaseException, parser: ArgumentParser) -> str:
    """The one line for jsonargparse's refusal ``error`` of a command line parsed by ``parser``.

    ``parser`` is the subcommand's (``fit``): its keys are the ones a typo is matched against.
    Where no kind below fits, the line is the failed check's own message after the flag.
    """
    message = str(error)
    report = _report(error)
    if report.check.startswith(_UNRECOGNIZED):
        return _unrecognized_line(report, parser)
    unknown = _UNKNOWN.search(report.check) or _NOT_ACCEPTED.search(report.check)
    if unknown is not None:  # an old flat data setting says where it moved
        return parser_error_line(message) or _unknown_line(report, unknown.group(1), parser)
    flag = "--" + ".".join(report.keys)
    if report.keys == ["trainer", "callbacks"] and report.value is not None:
        return callback_line(report.value)
    if report.check.startswith("Expected a ") and report.value is not None:
        hint = _typehint(report, parser)
        if hint is not None:  # the setting's whole type, not the one member of a union that failed last
            return f"{flag} must be {describe(hint)}, got {report.value!r}"
    line = parser_error_line(message)
    if line is not None:
        return line
    check = " ".join(report.check.split())
    return f"{flag}: {check}" if report.keys else check


def _config_values(args: Sequence[str]) -> list[str]:
    values = []
    for i, arg in enumerate(args):
        if arg in ("-c", "--config") and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith("--config="):
            values.append(arg.removeprefix("--config="))
    return values


def check_config_files(args: Sequence[str]) -> None:
    """Refuse a ``--config`` file that is missing or not YAML, naming it (jsonargparse would name
    neither the file nor, for a YAML mistake, anything but a line and column in "<unicode string>")."""
    import yaml

    for value in _config_values(args):
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
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
            problem = getattr(e, "problem", None) or " ".join(str(e).split())
            raise SettingError(f"--config {value}: {where}{problem}") from e


def check_init_from(config: Namespace) -> None:
    """Refuse a ``--model.init_from`` file that does not exist, before the data module and the
    Trainer start (the module reads it only once the fit has begun, in every DDP process).
    A resume (``--ckpt_path``) does not read it, so it is not checked then."""
    sub = config.get("subcommand")
    cfg = config[sub] if sub else config
    if cfg.get("ckpt_path"):
        return
    init_from = cfg.get("model.init_args.init_from") if cfg.get("model.init_args") else None
    if init_from and isinstance(init_from, str | os.PathLike) and not Path(init_from).is_file():
        raise FileNotFoundError(f"--model.init_from: no checkpoint file at {init_from}")


class FastlightArgumentParser(LightningArgumentParser):
    def dump(self, namespace: Namespace, *args: Any, **kwargs: Any) -> str:
        # Completing a config the CLI already completed changes nothing (e.g. the saved config.yaml).
        return super().dump(complete_run_config(namespace), *args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        # Only the command's own parsers exit on error; the nested ones jsonargparse builds for a
        # class raise, and their message reaches the top one inside its own.
        # FASTLIGHT_DEBUG=1: one_line_errors lets the SettingError's traceback through.
        line = parser_error_line(message) if self.exit_on_error else None
        if line is None:
            super().error(message, ex)
        raise SettingError(line) from ex
