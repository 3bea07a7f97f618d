"""What the ``fastlight`` command prints: no third-party noise, and a bad setting as one line.

- :func:`quiet_third_party` drops Lightning's "💡 Tip" advertisements (litlogger, litmodels) and
  warnings known to be harmless here (listed in :data:`KNOWN_WARNINGS`, each with its reason), so
  a run's output is the run's.
- :func:`one_line_errors` turns an error that names a setting (``--data.reset_mode must be one of
  dpsa | sgr | autoreset | sequential, got 'foo'``) into that one line on stderr and exit status 2,
  instead of jsonargparse's and Lightning's chained tracebacks around it. ``FASTLIGHT_DEBUG=1``
  keeps the full traceback. Only the command line (``fastlight.cli.main``) uses it; ``cli_main``
  called from Python raises as usual.
"""

from __future__ import annotations

import argparse
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


def debug_enabled() -> bool:
    return os.environ.get("FASTLIGHT_DEBUG", "") not in ("", "0")


def setting_error_line(error: BaseException) -> str | None:
    """The one line of ``error`` (or of an exception it was raised from) that names a CLI flag.

    The innermost such exception wins: it is the check that failed (jsonargparse wraps it in a
    "Does not validate against any of the Union subtypes" error that repeats it among others).
    """
    chain: list[BaseException] = []
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    for exc in reversed(chain):
        for line in str(exc).splitlines():
            line = line.strip().removeprefix("- ").strip()
            if _FLAG.search(line):
                return line
    return None


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Print a setting error as ``fastlight: error: <message>`` and exit with status 2."""
    from fastlight.extras import MissingExtraError, missing_extra_line

    try:
        yield
    except (ValueError, TypeError, MissingExtraError) as error:
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
