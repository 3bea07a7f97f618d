"""Checkpoint files: reading one (naming the file when it is missing or not a checkpoint) and
writing one atomically (:class:`AtomicCheckpointIO`). File I/O only: which LightningModule a
checkpoint holds, and loading it, is :mod:`fastlight.modules.loading`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import _load as pl_load
from lightning.pytorch.plugins.io import TorchCheckpointIO


def read_checkpoint(path: str | Path, *, flag: str = "--ckpt") -> dict[str, Any]:
    """``torch.load`` a Lightning checkpoint on the CPU, naming the file when it is missing or not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{flag}: no checkpoint file at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling error means "not a checkpoint"
        raise ValueError(f"{flag}: {path} is not a readable checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ValueError(f"{flag}: {path} is not a Lightning checkpoint (no 'state_dict')")
    return ckpt


def check_writable_dir(path: str | os.PathLike[str], *, flag: str = "--trainer.default_root_dir") -> None:
    """Refuse, in one line naming ``flag``, a directory this process cannot write to: a run's logs and
    checkpoints go there, and the first write (TensorBoard's, once the samplers have started) would
    fail with a long traceback. Creates nothing: the directory, or its nearest existing parent, must
    be a directory in which a file can be created. That is tried (a temporary file, removed at once)
    rather than read off permission bits, which miss read-only mounts and which root passes anyway.
    Remote paths (``s3://...``) are not checked."""
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
    os.close(fd)
    os.remove(name)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints that appear under their final name only when complete.

    Lightning's ``TorchCheckpointIO`` serialises to memory, then opens the final path for writing:
    a full disk or a kill during that write leaves a truncated file under the final name, and the
    previous ``last.ckpt`` is already gone. Here the bytes go to a temporary file in the same
    directory, are flushed and fsynced, and only then renamed over the final name (``os.replace``
    is atomic on POSIX). A failed save removes the temporary file, leaves the previous checkpoint
    intact and raises an ``OSError`` naming the path. Loading names the path and what is wrong.
    The ``fastlight`` CLI installs it unless ``--trainer.plugins`` brings another CheckpointIO.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote filesystems: Lightning's own way
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            if isinstance(e, OSError):
                raise OSError(
                    e.errno,
                    f"could not save checkpoint {path} ({e.strerror or e}); the previous file there, if any, "
                    "is unchanged",
                ) from e
            raise
        _fsync_dir(folder)  # the rename itself survives a power cut

    def load_checkpoint(
        self, path: Any, map_location: Any = lambda storage, loc: storage, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if "://" in str(path):
            return super().load_checkpoint(path, map_location, weights_only)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--ckpt_path: no checkpoint file at {path}")
        try:
            ckpt = pl_load(path, map_location=map_location, weights_only=weights_only)
        except Exception as e:  # noqa: BLE001 - any unpickling error means "not a checkpoint"
            raise ValueError(
                f"--ckpt_path: {path} is not a readable checkpoint, truncated or not written by torch.save "
                f"({os.path.getsize(path)} bytes; {type(e).__name__}: {e})"
            ) from e
        if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
            raise ValueError(f"--ckpt_path: {path} is not a Lightning checkpoint (no 'state_dict')")
        return ckpt


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
