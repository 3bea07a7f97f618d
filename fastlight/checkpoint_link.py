"""A checkpoint under a second, stable name: ``<dirpath>/last.ckpt`` for ``<dirpath>/version_N/last.ckpt``.

A hard link rather than a symlink: a symlink dangles once moved or once its run folder is deleted, and
every save writes a new file (:class:`~fastlight.checkpoints.AtomicCheckpointIO` renames over the old
one), so the two names never share a half-written file. A file already at the stable path that is no
other file's second name is kept under another name, never overwritten.
"""

from __future__ import annotations

import contextlib
import os
import shutil


def link_as(src: str, stable: str, *, keep_as: str | None = None) -> None:
    """Make ``stable`` a second name of ``src``, atomically (a hard link, then a rename; a copy where the
    filesystem has no hard links). ``keep_as``: a file name in ``stable``'s folder under which a file
    found at ``stable`` that is the only name of its data (no link of ``src``) is kept first."""
    folder = os.path.dirname(stable)
    if keep_as is not None and os.path.isfile(stable) and os.stat(stable).st_nlink == 1:
        if not os.path.samefile(stable, src):  # the only copy of another checkpoint: keep it
            os.replace(stable, os.path.join(folder, keep_as))
    tmp = os.path.join(folder, f".{os.path.basename(stable)}.link-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)
    try:
        try:
            os.link(src, tmp)
        except OSError:  # a filesystem without hard links: a copy
            shutil.copyfile(src, tmp)
        os.replace(tmp, stable)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)  # the previous stable file, if any, is unchanged
        raise
