"""What the ``fastlight`` command prints: no third-party noise, and a mistake as one line.

- :func:`quiet_third_party` drops Lightning's "💡 Tip" advertisements, its "Seed set to N", and
  warnings known to be harmless here (:data:`KNOWN_WARNINGS`, each with its reason).
- :func:`one_line_errors` prints a mistake as ``fastlight: error: <message>`` on stderr, exit status 2,
  instead of the chained tracebacks around it. A mistake is told apart by who raised it, never by
  its wording: a :class:`SettingError`, a ``ValueError`` / ``TypeError`` / ``OSError`` ... that a
  ``raise`` statement in fastlight's code raised, or Lightning's ``MisconfigurationException``.
  ``FASTLIGHT_DEBUG=1`` keeps the full traceback. A checkpoint or a log that could not be written
  exits 1 with its one line.
"""

from __future__ import annotations

import argparse
import dis
import logging
import os
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


class SettingError(ValueError):
    """A refused setting or command line; the message is the one line to print."""


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
    # No "Seed set to N" (it would come before a mistake found while building the classes).
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)


def debug_enabled() -> bool:
    return os.environ.get("FASTLIGHT_DEBUG", "") not in ("", "0")


#: The kinds of exception a setting's check raises (AttributeError: a module's attribute used too early).
_REFUSALS = (ValueError, TypeError, OSError, ImportError, AttributeError)


def _raised_by_fastlight(error: BaseException) -> bool:
    """``error`` was raised by a ``raise`` statement in fastlight's code: a refusal worded for the user,
    not an interpreter error in a line of fastlight (``None.x``, ``1 + "a"``), whose traceback is due."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or str(tb.tb_frame.f_globals.get("__name__", "")).partition(".")[0] != "fastlight":
        return False
    at = next((i for i in dis.get_instructions(tb.tb_frame.f_code) if i.offset == tb.tb_lasti), None)
    return at is not None and at.opname == "RAISE_VARARGS"


def setting_error_line(error: BaseException) -> str | None:
    """The one line to print for ``error``, or ``None`` when it is not a mistake in the settings. The
    innermost refusal of ``error``'s chain wins (jsonargparse wraps a constructor's refusal in a report
    of every type it tried), its lines joined into one."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from fastlight.checkpoints import exception_chain

    for exc in reversed(exception_chain(error)):
        refusal = isinstance(exc, _REFUSALS) and _raised_by_fastlight(exc)
        if refusal or isinstance(exc, SettingError | MisconfigurationException):
            return " ".join(str(exc).split())
    return None


def _first_line(error: BaseException | str) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")


def parse_error_line(message: str, error: BaseException | None) -> str:
    """jsonargparse's report of a refused command line (``message``, raised from ``error``) in one line,
    cut by the report's structure: the first line of each nested ``ArgumentError`` and of the innermost
    exception, e.g. ``Parser key "data": Parser key "num_envs": Expected a <class 'int'>. Got value:
    four``. A refusal of fastlight's own in the chain is its line."""
    from fastlight.checkpoints import exception_chain

    if error is not None and (own := setting_error_line(error)) is not None:
        return own
    chain = exception_chain(error) if error is not None else []
    levels = [message, *(e for e in chain if isinstance(e, argparse.ArgumentError)), *chain[-1:]]
    kept: list[str] = []
    for line in map(_first_line, levels):
        if line and not any(line in earlier for earlier in kept):  # a level that only repeats one above
            kept.append(line)
    return " ".join(kept)


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Print a mistake as ``fastlight: error: <message>`` and exit with status 2 (see the module)."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from fastlight.checkpoints import CheckpointWriteError
    from fastlight.log_writes import LogWriteError

    try:
        yield
    except (CheckpointWriteError, LogWriteError) as error:  # a full disk, a read-only filesystem
        if debug_enabled():
            raise
        if not error.reported:  # PreemptionCheckpoint's stop line already says it
            print(f"fastlight: error: {error.strerror}", file=sys.stderr)
        raise SystemExit(1) from None
    except (*_REFUSALS, MisconfigurationException) as error:
        line = None if debug_enabled() else setting_error_line(error)
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
