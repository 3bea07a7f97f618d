"""A logger's write that fails (a full disk, a read-only filesystem, an I/O error) stops the run in one line.

TensorBoard writes from a thread of its own, which prints its ``OSError`` as a traceback, keeps it, and
raises it again at every later write from the training loop, where Lightning's TensorBoardLogger wraps
any error as ``ValueError: you tried to log ... which is currently not supported``; Lightning then
finalizes the loggers after the failure, and their flush raises the ``OSError`` once more.

:func:`guard_logger_writes` (the ``fastlight`` command applies it to every logger of its Trainer) wraps
each logger's writing methods: an ``OSError`` anywhere in the chain of what one raises becomes a
:class:`LogWriteError`, one line naming the logger, the path, the error and the free space there
(``shutil.disk_usage``); :class:`~fastlight.callbacks.preemption.PreemptionCheckpoint` adds the
checkpoint to resume from, and the command exits 1. A logger whose write failed writes nothing more,
and its ``finalize`` after a failed run (``status`` other than ``success``) says nothing: the run's own
error is the one reported. TensorBoard's writer thread no longer prints its ``OSError`` (the training
loop's next write raises it, named).
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
    """A logger could not write its files. Its message is one line: the logger, the path, the error and
    the free space there (the original errno is kept)."""

    #: Set once the line has been printed (PreemptionCheckpoint's stop line), so the command does not
    #: print it twice.
    reported: bool = False


class _Guard:
    """One logger's state: whether a write of its own has failed."""

    def __init__(self, logger: Any) -> None:
        self.logger, self.failed = logger, False


class _GuardedWrite:
    """A logger's method ``name``, called through its class (the instance attribute is this object), with
    a failed write turned into a :class:`LogWriteError`. A plain class, not a closure: a Trainer that a
    launcher pickles (``ddp_spawn``) pickles its loggers too."""

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
            cause = next((c for c in exception_chain(e) if isinstance(c, OSError)), None)
            if cause is None:
                raise
            guard.failed = True
            status = args[0] if args else kwargs.get("status")
            if self.name == "finalize" and status != "success":
                return None  # the run already stops for another reason, the one to report
            if isinstance(e, LogWriteError):  # said by a guarded method it called (TensorBoard's save)
                raise
            raise LogWriteError(cause.errno, log_write_line(guard.logger, cause)) from cause


def guard_logger_writes(loggers: Iterable[Any]) -> None:
    """Wrap the writing methods (:data:`WRITES`) of every logger in ``loggers`` (see the module
    docstring); a logger already guarded is left as it is."""
    for logger in loggers:
        if isinstance(logger.__dict__.get(WRITES[0]), _GuardedWrite):
            continue
        guard = _Guard(logger)
        for name in WRITES:
            if callable(getattr(logger, name, None)):
                setattr(logger, name, _GuardedWrite(guard, name))
    _quiet_writer_threads()


def log_write_line(logger: Any, error: OSError) -> str:
    """One line for ``logger``'s failed write: the logger, the file (or its folder), the error and the
    free space there."""
    folder = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None) or os.getcwd()
    folder = os.path.abspath(os.fspath(folder))
    where = os.fspath(error.filename) if error.filename else folder
    code = errno_names.errorcode.get(error.errno or 0, str(error.errno))
    what = f"{error.strerror or error} ({code})"
    return f"could not write the logs of {type(logger).__name__} in {where}: {what}; {free_space(folder)}"


def _quiet_writer_threads() -> None:
    """Drop the traceback TensorBoard's writer thread prints for an ``OSError`` (it raises the same
    error again in the training loop, where the guard names it); every other thread's exception is
    printed as before. Installed once per process."""
    previous = threading.excepthook
    if isinstance(previous, _QuietWriterThreads):
        return
    threading.excepthook = _QuietWriterThreads(previous)


class _QuietWriterThreads:
    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, args: Any) -> None:
        if isinstance(args.exc_value, OSError) and type(args.thread).__module__ == _WRITER_THREAD_MODULE:
            return
        self.previous(args)
