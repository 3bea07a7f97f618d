"""What the ``fastlight`` command prints: no third-party noise, and a bad setting as one line.

- :func:`quiet_third_party` drops Lightning's "💡 Tip" advertisements (litlogger, litmodels) and
  warnings known to be harmless here (listed in :data:`KNOWN_WARNINGS`, each with its reason), so
  a run's output is the run's; Lightning's "Seed set to N" waits for the Trainer's first line, so
  a mistake found before the Trainer exists is the only line (:class:`_HeldSeedLine`).
- :func:`one_line_errors` turns an error that names a setting (``--data.reset_mode must be one of
  dpsa | sgr | autoreset | sequential, got 'foo'``) into that one line on stderr and exit status 2,
  instead of jsonargparse's and Lightning's chained tracebacks around it: a :class:`SettingError`
  (the CLI's own refusals, :mod:`fastlight.cli_parser`), a ``ValueError`` / ``TypeError`` /
  ``OSError`` whose message names a flag (``--ckpt_path: no checkpoint file at ...``), a Lightning
  ``MisconfigurationException`` about a Trainer argument (:func:`trainer_setting_line`) and a
  keyword the env does not take (:func:`env_kwargs_line`). ``FASTLIGHT_DEBUG=1`` keeps the full
  traceback. Only the command line (``fastlight.cli.main``) uses it; ``cli_main`` called from
  Python raises as usual. A checkpoint that could not be written (a full disk) exits 1 with its one
  line (:class:`~fastlight.checkpoints.CheckpointWriteError`), printed once.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

#: (message regex, category, why it is safe to hide).
KNOWN_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        FutureWarning,
        "torch >= 2.9 deprecates LeafSpec; Lightning's own _pytree still uses it (nothing to do here)",
    ),
    (
        r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is"
        r" not resumable",
        UserWarning,  # Lightning's PossibleUserWarning
        "an RL stream has no position to restore: the samplers start fresh episodes on the restored "
        "weights, and the epoch only paces checkpoints (RolloutDataModule's steps_per_epoch)",
    ),
)

#: A CLI flag inside an error message: ``--data.seed``, ``--model.policy.init_args.vocab_size``.
_FLAG = re.compile(r"--[A-Za-z_]+\.[A-Za-z_.]+")
#: A line that starts with a flag of the command itself: ``--ckpt_path: no checkpoint file at ...``.
_LEADING_FLAG = re.compile(r"--[A-Za-z_]\w*\b")


class SettingError(ValueError):
    """A refused setting; the message is the one line to print, naming the flag."""


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def quiet_third_party() -> None:
    """Hide Lightning's tips and the known warnings (idempotent)."""
    for message, category, _why in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    # Lightning's rank_zero_info writes through this module's logger (lightning.fabric rebinds it).
    from lightning_utilities.core import rank_zero

    if not any(isinstance(f, _DropTips) for f in rank_zero.log.filters):
        rank_zero.log.addFilter(_DropTips())
    _SEED_LINE.install()


class _HeldSeedLine:
    """Lightning's "Seed set to N", printed just before the next line Lightning prints.

    LightningCLI seeds before it builds the data module, the module and the Trainer, so a mistake
    found while building them (``--trainer.max_time 2min``, a keyword the env does not take) would
    print second, after a line that says nothing about it. Held, the seed line comes out with the
    Trainer's first line (its device summary on rank 0, "Initializing distributed" on the others),
    in the same order as without this; a command that stops before then prints its error alone.
    """

    def __init__(self) -> None:
        self.held: logging.LogRecord | None = None

    def hold(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).lstrip("[rank: 0123456789]").startswith("Seed set to"):
            return True
        self.held = record
        return False

    def release(self, record: logging.LogRecord) -> bool:
        held, self.held = self.held, None
        if held is not None and held is not record:
            logging.getLogger(held.name).callHandlers(held)
        return True

    def install(self) -> None:
        loggers = [logging.getLogger(name) for name in ("lightning.fabric", "lightning.pytorch")]
        handlers = [h for logger in loggers for h in logger.handlers]
        if not handlers:  # Lightning hands its lines to the root logger's handlers: nothing of ours to time
            return
        seed_log = logging.getLogger("lightning.fabric.utilities.seed")
        if self.hold not in seed_log.filters:
            seed_log.addFilter(self.hold)
        for handler in handlers:
            if self.release not in handler.filters:
                handler.addFilter(self.release)


_SEED_LINE = _HeldSeedLine()


def debug_enabled() -> bool:
    return os.environ.get("FASTLIGHT_DEBUG", "") not in ("", "0")


def exception_chain(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from (or during), outermost first."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def setting_error_line(error: BaseException) -> str | None:
    """The one line of ``error`` (or of an exception it was raised from) that names a CLI flag.

    A :class:`SettingError` is that line already. Otherwise the innermost exception naming a flag
    wins: it is the check that failed (jsonargparse wraps it in a "Does not validate against any of
    the Union subtypes" error that repeats it among others).
    """
    chain = exception_chain(error)
    for exc in chain:
        if isinstance(exc, SettingError):
            return str(exc)
    for exc in chain:
        line = trainer_setting_line(exc) or env_kwargs_line(exc)
        if line is not None:
            return line
    for exc in reversed(chain):
        for line in str(exc).splitlines():
            line = line.strip().removeprefix("- ").strip()
            if _FLAG.search(line) or _LEADING_FLAG.match(line):
                return line
    return None


def closest(name: str, candidates: list[str]) -> str | None:
    """The one of ``candidates`` that ``name`` most likely meant: its initials (``learning_rate`` for
    ``lr``, or the other way round) or a slip of spelling (difflib), else ``None``."""

    def initials(s: str) -> str:
        return "".join(part[0] for part in s.split("_") if part)

    for c in candidates:
        if ("_" in name and initials(name) == c) or ("_" in c and initials(c) == name):
            return c
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return close[0] if close else None


def _raised_in(error: BaseException, function: str) -> bool:
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == function:
            return True
        tb = tb.tb_next
    return False


#: A Trainer argument in a Lightning message: ```max_steps``` or ```Trainer(devices='x')```.
_TRAINER_ARG = re.compile(r"`(?:Trainer\((\w+)=([^`]*)\)|(\w+))`")
_TIMER = re.compile(r"`Timer\(duration=(.*)\)` is not a valid duration")


def trainer_setting_line(error: BaseException) -> str | None:
    """A Lightning ``MisconfigurationException`` about a Trainer argument, as the line naming its flag.

    Lightning names the argument in backticks (```max_steps` must be a non-negative integer or -1
    (infinite steps). You passed in -5.``): it becomes ``--trainer.max_steps``. ``--trainer.max_time``
    reaches the user as the Timer callback Lightning makes of it, so that message is rewritten.
    """
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    if not isinstance(error, MisconfigurationException):
        return None
    message = " ".join(str(error).split())
    timer = _TIMER.match(message)
    if timer is not None and _raised_in(error, "_configure_timer_callback"):
        return (
            "--trainer.max_time must be DD:HH:MM:SS (e.g. 00:00:10:00) or a dict like {minutes: 10}, "
            f"got {timer.group(1)}"
        )
    from lightning.pytorch import Trainer

    arguments = inspect.signature(Trainer.__init__).parameters
    for found in _TRAINER_ARG.finditer(message):
        name = found.group(1) or found.group(3)
        if name not in arguments or name == "self":
            continue
        flag = f"--trainer.{name}" + (f" {found.group(2)}" if found.group(1) else "")
        line = message[: found.start()] + flag + message[found.end() :]
        line = re.sub(r"\.\s*You passed in (.+?)\.?$", r", got \1", line)
        return line if line.startswith("--trainer.") else f"--trainer.{name}: {line}"
    return None


#: How gymnasium re-raises a ``TypeError`` of an env's constructor (``gymnasium.make``).
_ENV_CREATOR = " was raised from the environment creator for "


def env_kwargs_line(error: BaseException) -> str | None:
    """gymnasium's "got an unexpected keyword argument" of an env, as a line naming ``--data.env_kwargs``,
    the keyword and those the env takes (with highway-env's ``config`` keys, ``default_config()``)."""
    cause, message = error.__cause__, str(error)
    if not isinstance(error, TypeError) or cause is None or not message.startswith(f"{cause}{_ENV_CREATOR}"):
        return None
    env_id = message[len(f"{cause}{_ENV_CREATOR}") :].split(" with kwargs ", 1)[0]
    bad = re.search(r"unexpected keyword argument '(\w+)'", str(cause))
    takes = _env_keywords(env_id)
    if bad is None or takes is None:
        return f"--data.env_kwargs: {cause} (from {env_id}'s constructor)"
    keyword, (names, config_keys) = bad.group(1), takes
    if keyword in config_keys:
        write = f"{{config: {{{keyword}: ...}}}}"
        return f"--data.env_kwargs: {keyword} is a setting of {env_id}'s config: write {write}"
    line = f"--data.env_kwargs: {env_id} takes no keyword {keyword!r}; it takes {', '.join(names) or 'none'}"
    if config_keys:
        line += f" (config keys, from its default_config(): {', '.join(config_keys)})"
    close = closest(keyword, names + config_keys)
    return line + (f"; did you mean {close}?" if close else "")


def _env_keywords(env_id: str) -> tuple[list[str], list[str]] | None:
    """The keyword arguments ``env_id``'s constructor takes and, where it has a ``config`` argument and
    a ``default_config()`` (highway-env), that config's keys; ``None`` where they cannot be read."""
    try:
        import gymnasium as gym
        from gymnasium.envs.registration import load_env_creator

        entry = gym.spec(env_id).entry_point
        creator = load_env_creator(entry) if isinstance(entry, str) else entry
        parameters = inspect.signature(creator).parameters.values()
    except Exception:  # noqa: BLE001 - an env we cannot inspect: its own message is the line
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    default_config = getattr(creator, "default_config", None)
    config_keys = sorted(default_config()) if "config" in names and callable(default_config) else []
    return names, config_keys


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Print a setting error as ``fastlight: error: <message>`` and exit with status 2."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from fastlight.checkpoints import CheckpointWriteError
    from fastlight.extras import MissingExtraError, missing_extra_line

    try:
        yield
    except CheckpointWriteError as error:  # a full disk, a read-only filesystem: not a setting
        if debug_enabled():
            raise
        if not error.reported:  # PreemptionCheckpoint's stop line already says it
            print(f"fastlight: error: {error.strerror}", file=sys.stderr)
        raise SystemExit(1) from None
    # OSError: a file a flag names (--ckpt_path, --model.init_from) is missing or unreadable.
    except (ValueError, TypeError, OSError, MisconfigurationException, MissingExtraError) as error:
        line = None if debug_enabled() else missing_extra_line(error) or setting_error_line(error)
        if line is None:
            raise
        print(f"fastlight: error: {line}  (FASTLIGHT_DEBUG=1 shows the traceback)", file=sys.stderr)
        raise SystemExit(2) from None


def fail(message: str, *, prog: str = "fastlight") -> NoReturn:
    """Print ``<prog>: error: <message>`` (one line) and exit with status 2, as argparse does."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag (``fastlight evaluate``, ``plot``)."""

    def error(self, message: str) -> NoReturn:
        fail(message, prog=self.prog)
