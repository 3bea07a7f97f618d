"""Files a user is handed run no code: checkpoints, demo caches and saved env states.

**Tensors and plain data.** Every checkpoint and cache fastlight reads goes through :func:`safe_load`
(``torch.load(weights_only=True)`` plus :data:`ALLOWED`): a file that names anything else is refused
before any of it is built, in one line naming the file and the globals it asks for. The sha256 in a
checkpoint (:mod:`fastlight.checkpoints`) is no signature: anyone can compute it.

**Saved env states** (``--data.exact_resume``) are pickles by nature; they are unpickled only when their
HMAC matches this user's own key (:func:`local_mac`, a random key in
``$XDG_CONFIG_HOME/fastlight/resume.key``, mode 0600), i.e. only when a run of this user wrote them.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pickle
import secrets
from pathlib import Path
from typing import IO, Any

import torch

#: Classes besides tensors and plain containers that a fastlight checkpoint may hold (none today: a
#: class added here must build nothing but data when unpickled).
ALLOWED: list[Any] = []

_KEY_BYTES = 32


class UnsafeFileError(ValueError):
    """A file asks its unpickler to import or call something other than tensors and plain data."""


def safe_load(
    source: str | os.PathLike[str] | IO[bytes], *, flag: str, map_location: Any = "cpu", mmap: bool = False
) -> Any:
    """``torch.load(source, weights_only=True)`` with :data:`ALLOWED`; a file that asks for any other
    global raises :class:`UnsafeFileError` naming ``flag``, the file and those globals."""
    with torch.serialization.safe_globals(ALLOWED):
        try:
            return torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as e:
            if not (asked := _unsafe_globals(source)):
                raise
            raise UnsafeFileError(
                f"{flag}: {os.fspath(source) if not hasattr(source, 'read') else 'the file'} is refused: it "
                f"asks to import {', '.join(asked[:5])}, and loading it would run that code. fastlight reads "
                "checkpoints as tensors and plain data only; a file fastlight wrote never needs more "
                "(a checksum does not make a file safe: anyone can compute one)"
            ) from e


def _unsafe_globals(source: Any) -> list[str]:
    """The globals beyond torch's own and :data:`ALLOWED` that ``source`` names, read without running it."""
    with contextlib.suppress(Exception):
        if hasattr(source, "seek"):
            source.seek(0)
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(source))
    return []


def key_path() -> Path:
    """Where this user's resume key lives."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "fastlight" / "resume.key"


def _local_key() -> bytes:
    """This user's key, made on first use (random, mode 0600); concurrent first uses agree on one."""
    path = key_path()
    with contextlib.suppress(FileNotFoundError):
        return path.read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(_KEY_BYTES))
    try:
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)  # atomic, and fails when another process made the key first
    finally:
        os.remove(tmp)
    return path.read_bytes()


def local_mac(data: bytes) -> str:
    """HMAC-SHA256 of ``data`` under this user's key: proves a blob was written by this user's runs."""
    return hmac.new(_local_key(), data, hashlib.sha256).hexdigest()


def signed_here(data: bytes, mac: str | None) -> bool:
    """Whether ``mac`` is :func:`local_mac` of ``data`` (a missing one never is)."""
    return isinstance(mac, str) and hmac.compare_digest(local_mac(data), mac)
