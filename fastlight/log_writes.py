"""A logger's write that fails (a full disk, a read-only filesystem, an I/O error) stops the run in one line.

:func:`guard_logger_writes` (the ``fastlight`` command applies it to every logger of its Trainer) wraps
each logger's writing methods: an ``OSError`` anywhere in the chain of what one raises (Lightning's
TensorBoardLogger wraps it in a ``ValueError``) becomes a :class:`LogWriteError`, one line naming the
logger, the path, the error and the free space there. A logger whose write failed writes nothing more,
and its ``finalize`` after a failed run says nothing: the run's own error is the one reported.
TensorBoard's writer thread no longer prints its ``OSError`` (the training loop's next write raises it).
"""

from __future__ import annotations

import errno as errno_names
import os
import threading
from collections.abc import Iterable
from typing import Any

from fastlight.checkpoints import exception_chain, free_space

#: The logger methods that write files (Lightning's ``Logger`` interface).
WRITES = ("log_metrics", "log_hyperparams", "log_graph", "save", "finalize")
#: TensorBoard's event-file writer thread (``torch.utils.tensorboard`` writes through it): it keeps its
#: exception and raises it again at the next write or flush from the thread that logs.
_WRITER_THREAD_MODULE = "tensorboard.summary.writer.event_file_writer"


class LogWriteError(OSError):
    """A logger could not write its files; one line, the original errno kept."""

    reported: bool = False  #: the line was printed (PreemptionCheckpoint's stop line): not again


class _Guard:
    """One logger's state: whether a write of its own has failed."""

    def __init__(self, logger: Any) -> None:
        self.logger, self.failed = logger, False


class _GuardedWrite:
    """A logger's method ``name``, called through its class, with a failed write turned into a
    :class:`LogWriteError` (a class, not a closure: ``ddp_spawn`` pickles the loggers)."""

    def __init__(self, guard: _Guard, name: str) -> None:
        self.guard, self.name = guard, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        guard = self.guard
        if guard.failed:  # its files are behind a write that failed: nothing more is tried
            return None
        try:
            return getattr(type(guard.logger), self.name)(guard.logger, *args, **kwargs)
        except Exception as e:
            # Lightning's TensorBoardLogger raises a ValueError from the writer's OSError.
            if (cause := next((c for c in exception_chain(e) if isinstance(c, OSError)), None)) is None:
                raise
            guard.failed = True
            status = args[0] if args else kwargs.get("status")
            if self.name == "finalize" and status != "success":
                return None  # the run already stops for another reason, the one to report
            if isinstance(e, LogWriteError):  # said by a guarded method it called (TensorBoard's save)
                raise
            raise LogWriteError(cause.errno, log_write_line(guard.logger, cause)) from cause


def guard_logger_writes(loggers: Iterable[Any]) -> None:
    """Wrap the writing methods (:data:`WRITES`) of every logger not guarded yet."""
    for logger in loggers:
        if isinstance(logger.__dict__.get(WRITES[0]), _GuardedWrite):
            continue
        guard = _Guard(logger)
        for name in WRITES:
            if callable(getattr(logger, name, None)):
                setattr(logger, name, _GuardedWrite(guard, name))
    _quiet_writer_threads()


def log_write_line(logger: Any, error: OSError) -> str:
    """One line for ``logger``'s failed write: the logger, the file (or folder), the error, the free space."""
    folder = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None) or os.getcwd()
    folder = os.path.abspath(os.fspath(folder))
    where = os.fspath(error.filename) if error.filename else folder
    code = errno_names.errorcode.get(error.errno or 0, str(error.errno))
    what = f"{error.strerror or error} ({code})"
    return f"could not write the logs of {type(logger).__name__} in {where}: {what}; {free_space(folder)}"


def _quiet_writer_threads() -> None:
    """Drop TensorBoard's writer-thread traceback for an ``OSError``; installed once per process."""
    if not isinstance(threading.excepthook, _QuietWriterThreads):
        threading.excepthook = _QuietWriterThreads(threading.excepthook)


class _QuietWriterThreads:
    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, args: Any) -> None:
        if isinstance(args.exc_value, OSError) and type(args.thread).__module__ == _WRITER_THREAD_MODULE:
            return
        self.previous(args)
