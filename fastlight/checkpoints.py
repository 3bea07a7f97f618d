"""Checkpoint files: reading one (naming the file when it is missing, not a checkpoint or corrupt) and
writing one atomically, with a checksum (:class:`AtomicCheckpointIO`). Which LightningModule a checkpoint
holds is :mod:`fastlight.modules.loading`.

**Checksum.** A checkpoint :class:`AtomicCheckpointIO` writes carries the sha256 of the bytes
``torch.save`` wrote in the zip archive's comment (``fastlight-sha256:<hex>``, the last 81 bytes of the
file), so it stays a plain torch checkpoint. :func:`verify_checksum` (called by :func:`read_checkpoint`)
refuses a damaged file in one line naming it; a file without the comment is loaded unchecked; a file is
checked once per process. The checksum proves the file intact, not safe (:mod:`fastlight.safe_files`).

**Failed writes.** A full disk, a read-only filesystem or an I/O error is a :class:`CheckpointWriteError`,
one line naming the path, the free space there and the last good checkpoint. While a save runs,
:func:`save_in_progress` is true, so the stop-signal handler never raises inside ``torch.save``.
"""

from __future__ import annotations

import contextlib
import errno as errno_names
import hashlib
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from fastlight.safe_files import ALLOWED, UnsafeFileError, safe_load

#: The zip comment of a checksummed checkpoint: this prefix, then 64 hex digits.
CHECKSUM_PREFIX = b"fastlight-sha256:"
_COMMENT_LEN = len(CHECKSUM_PREFIX) + 64
_END_RECORD = 22  # a zip's end-of-central-directory record without its comment
_END_SIGNATURE = b"PK\x05\x06"
_VERSION_DIR = re.compile(r"version_\d+")

_saves_running = 0
#: Files whose checksum matched, by (device, inode, size, mtime): checked once per process.
_verified: set[tuple[int, int, int, int]] = set()


def save_in_progress() -> bool:
    """Whether a checkpoint is being written by this process (see the module docstring)."""
    return _saves_running > 0


@contextlib.contextmanager
def saving() -> Iterator[None]:
    """Mark a checkpoint write: a stop signal arriving meanwhile waits until it is on disk."""
    global _saves_running
    _saves_running += 1
    try:
        yield
    finally:
        _saves_running -= 1


def read_checkpoint(
    path: str | Path, *, flag: str = "--ckpt", map_location: Any = "cpu", sharded: bool = False
) -> dict[str, Any]:
    """``torch.load`` a Lightning checkpoint, its checksum verified, naming ``flag`` and the file when it is
    missing, corrupt or not a checkpoint. A sharded one (an fsdp2 ``sharded-step=<S>`` folder) gives its
    ``meta.pt`` (all but the weights and optimizer state) where ``sharded`` allows it; else it is refused."""
    path = Path(path)
    if path.is_dir() and (path / "meta.pt").is_file():
        if sharded:
            return safe_load(path / "meta.pt", flag=flag, map_location=map_location)
        raise ValueError(
            f"{flag}: {path} is a sharded checkpoint (each rank's shards, written under --trainer.strategy "
            "fsdp2): only a run under fsdp2 reads it, resuming with --ckpt_path"
        )
    if not path.is_file():
        raise FileNotFoundError(f"{flag}: no checkpoint file at {path}")
    verify_checksum(path, flag=flag)
    try:
        ckpt = safe_load(path, flag=flag, map_location=map_location)
    except UnsafeFileError:
        raise
    except Exception as e:  # noqa: BLE001 - any unpickling error means "not a checkpoint"
        raise ValueError(
            f"{flag}: {path} is not a readable checkpoint, truncated or not written by torch.save "
            f"({path.stat().st_size} bytes; {type(e).__name__}: {e})"
        ) from e
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ValueError(f"{flag}: {path} is not a Lightning checkpoint (no 'state_dict')")
    return ckpt


#: Bytes the writable-root check writes (and removes): enough to meet a full filesystem's ENOSPC.
WRITE_CHECK_BYTES = 64 * 1024


def check_writable_dir(path: str | os.PathLike[str], *, flag: str = "--trainer.default_root_dir") -> None:
    """Refuse, in one line naming ``flag``, a directory (or its nearest existing parent) in which this
    process cannot create and write a file. Creates nothing; tried with a temporary file rather than read
    off permission bits, which miss read-only mounts and which root passes anyway. Remote paths are not
    checked."""
    text = os.fspath(path)
    if "://" in text:
        return
    probe = os.path.abspath(os.path.expanduser(text))
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ValueError(f"{flag} {text}: not writable ({probe} is a file, not a directory)")
    try:
        fd, name = tempfile.mkstemp(prefix=".fastlight-write-check-", dir=probe)
    except OSError as e:
        raise ValueError(
            f"{flag} {text}: not writable ({type(e).__name__}: {e.strerror or e} creating a file in "
            f"{probe}); choose a directory this user can write to"
        ) from e
    try:
        # A full filesystem still lets an empty file be created; a write of a few pages it refuses.
        os.write(fd, bytes(WRITE_CHECK_BYTES))
    except OSError as e:
        raise ValueError(
            f"{flag} {text}: not writable ({type(e).__name__}: {e.strerror or e} writing a file in {probe}; "
            f"{free_space(probe)}); free space there or choose another directory"
        ) from e
    finally:
        os.close(fd)
        os.remove(name)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; its message is one line (see the module docstring)."""

    reported: bool = False  #: the line was printed (PreemptionCheckpoint's stop line): not again


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints that appear under their final name only when complete, with a checksum: ``torch.save``
    streams to a temporary file beside it, hashed as it goes, then fsynced and renamed over the final
    name, so a full disk or a kill mid-write never leaves a truncated file there. A failed save leaves
    the previous checkpoint intact and raises a :class:`CheckpointWriteError` (the original errno)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote filesystems: Lightning's own way
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
        try:
            with saving():
                os.makedirs(folder, exist_ok=True)
                with open(tmp, "wb") as f:
                    writer = _HashingWriter(f)
                    try:
                        torch.save(checkpoint, writer)
                    except BaseException as e:
                        # torch's zip writer wraps an OSError (or a signal's SystemExit) in a RuntimeError.
                        chain = exception_chain(e)
                        raise next(
                            (c for c in chain if not isinstance(c, Exception) or isinstance(c, OSError)), e
                        ) from None
                    writer.sign()
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            if isinstance(e, OSError):
                line = write_error_line(path, e, payload_bytes(checkpoint))
                raise CheckpointWriteError(e.errno, line) from e
            raise
        _fsync_dir(folder)  # the rename itself survives a power cut

    def load_checkpoint(
        self, path: Any, map_location: Any = lambda storage, loc: storage, weights_only: bool | None = None
    ) -> dict[str, Any]:
        # weights_only whatever the caller asks (see fastlight.safe_files): a file must not run code
        if "://" in str(path):
            with torch.serialization.safe_globals(ALLOWED):
                return super().load_checkpoint(path, map_location, weights_only=True)
        return read_checkpoint(path, flag="--ckpt_path", map_location=map_location)


class _HashingWriter:
    """The file object ``torch.save`` writes to: passes every write on and hashes it (no second pass)."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.tail = b""  # the last bytes written: the archive's end record once torch is done

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.f.write(view)
        self.sha.update(view)
        self.tail = (self.tail + view[-_END_RECORD:].tobytes())[-_END_RECORD:]
        return view.nbytes

    def flush(self) -> None:
        self.f.flush()

    def sign(self) -> None:
        """Put the checksum in the archive's comment: the end record's comment length, then the comment."""
        if not (self.tail.startswith(_END_SIGNATURE) and self.tail.endswith(b"\0\0")):
            return  # not a zip archive ending without a comment (a legacy torch format): left as it is
        self.f.seek(-2, os.SEEK_END)
        self.f.write(struct.pack("<H", _COMMENT_LEN) + CHECKSUM_PREFIX + self.sha.hexdigest().encode())


def exception_chain(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from (or during), outermost first."""
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and all(e is not seen for seen in chain):
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def verify_checksum(path: str | os.PathLike[str], *, flag: str = "--ckpt_path") -> bool:
    """True when the checksum matches, False when there is none; a mismatch raises a one-line ValueError."""
    path = os.fspath(path)
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _verified:
        return True
    size = st.st_size
    with open(path, "rb") as f:
        if size < _END_RECORD + _COMMENT_LEN:
            return False
        f.seek(size - _END_RECORD - _COMMENT_LEN)
        end = f.read()
        if end[:4] != _END_SIGNATURE or end[_END_RECORD:][: len(CHECKSUM_PREFIX)] != CHECKSUM_PREFIX:
            return False
        expected = end[_END_RECORD + len(CHECKSUM_PREFIX) :].decode("ascii", errors="replace")
        sha = hashlib.sha256()
        f.seek(0)
        remaining = size - _COMMENT_LEN - 2  # all but the comment length and the comment
        while remaining > 0:
            chunk = f.read(min(remaining, 8 << 20))
            if not chunk:
                break
            sha.update(chunk)
            remaining -= len(chunk)
        sha.update(b"\0\0")  # the comment length torch wrote
    actual = sha.hexdigest()
    if actual != expected or struct.unpack("<H", end[_END_RECORD - 2 : _END_RECORD])[0] != _COMMENT_LEN:
        other = last_good_checkpoint(path, exclude=path)
        instead = (
            f"resume from another checkpoint, e.g. {other}" if other else "no other checkpoint is near it"
        )
        raise ValueError(
            f"{flag}: {path} is corrupt: the sha256 of its contents is {actual[:16]}..., not the "
            f"{expected[:16]}... it was saved with (the file changed after it was written, e.g. a disk or "
            f"copy error); {instead}"
        )
    _verified.add(key)
    return True


def last_good_checkpoint(path: str, *, exclude: str | None = None) -> str | None:
    """The newest checkpoint to resume from instead of ``path`` (whose save failed, or, given as
    ``exclude``, which is corrupt): ``path`` itself unless excluded, else the newest ``*.ckpt`` beside
    it or in its run layout (``<dirpath>/*.ckpt``, ``<dirpath>/version_N/*.ckpt``); None when none."""
    if exclude is None and os.path.isfile(path):
        return path
    folder = os.path.dirname(os.path.abspath(path))
    where = [folder]
    if _VERSION_DIR.fullmatch(os.path.basename(folder)):  # a run's folder: its <dirpath> too
        where.append(os.path.dirname(folder))
    with contextlib.suppress(OSError):
        where += [e.path for e in os.scandir(where[-1]) if e.is_dir() and _VERSION_DIR.fullmatch(e.name)]
    found: list[tuple[float, str]] = []
    for place in dict.fromkeys(where):
        with contextlib.suppress(OSError):
            for entry in os.scandir(place):
                if not entry.name.endswith(".ckpt") or entry.name.startswith(".") or not entry.is_file():
                    continue
                if exclude is not None and os.path.samefile(entry.path, exclude):
                    continue  # the corrupt file itself, under any of its names
                found.append((entry.stat().st_mtime, entry.path))
    return max(found)[1] if found else None


def write_error_line(path: str, error: OSError, needed: int | None = None) -> str:
    """One line for a checkpoint that could not be written: the path, the error, the space it needs
    (about ``needed`` bytes), the free space there, and the last good checkpoint."""
    folder = os.path.dirname(os.path.abspath(path))
    code = errno_names.errorcode.get(error.errno or 0, str(error.errno))
    space = f"it needs about {_size(needed)}, {free_space(folder)}" if needed else free_space(folder)
    last = last_good_checkpoint(path)
    resume = "no earlier checkpoint to resume from"
    if last is not None:
        resume = f"last good checkpoint to resume from: {last}" + (" (unchanged)" if last == path else "")
    return f"could not save checkpoint {path}: {error.strerror or error} ({code}); {space}; {resume}"


def free_space(folder: str) -> str:
    """``<free> free of <total> on the filesystem of <folder>``, for a line about a failed write."""
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return f"free space of {folder} unknown"
    return f"{_size(usage.free)} free of {_size(usage.total)} on the filesystem of {folder}"


def payload_bytes(obj: Any) -> int:
    """The bytes of the tensors in a checkpoint (each storage once): about the size of its file."""
    seen: set[int] = set()
    total, stack = 0, [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
