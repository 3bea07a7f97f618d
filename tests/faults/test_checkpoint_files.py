"""Atomic checkpoint files: a save that fails (disk full) leaves the previous file intact and no
partial file behind; loading a truncated or foreign file names the path and what is wrong."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from fastlight.checkpoints import AtomicCheckpointIO
from fastlight.cli import cli_main

CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "configs",
    "highway_dpsa.yaml",
)


def checkpoint(step: int) -> dict:
    return {"state_dict": {"w": torch.full((1000,), float(step))}, "global_step": step}


def disk_full_after(nbytes: int):
    """A torch.save that writes ``nbytes`` of the real bytes, then fails as a full disk does."""
    real = torch.save

    def save(obj, f, *args, **kwargs):
        import io

        buf = io.BytesIO()
        real(obj, buf)
        f.write(buf.getvalue()[:nbytes])
        raise OSError(errno.ENOSPC, "No space left on device")

    return save


def test_save_is_complete_and_leaves_no_temporary_file(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "ckpts" / "last.ckpt"
    io.save_checkpoint(checkpoint(3), path)
    assert os.listdir(tmp_path / "ckpts") == ["last.ckpt"]
    assert io.load_checkpoint(path)["global_step"] == 3


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint(checkpoint(1), path)
    before = path.read_bytes()
    monkeypatch.setattr(torch, "save", disk_full_after(100))
    with pytest.raises(OSError, match=f"could not save checkpoint {path} .*No space left.*unchanged") as info:
        io.save_checkpoint(checkpoint(2), path)
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == before  # still step 1, whole
    assert os.listdir(tmp_path) == ["last.ckpt"]  # the partial temporary file is gone
    monkeypatch.undo()
    assert io.load_checkpoint(path)["global_step"] == 1


def test_loading_a_truncated_file_names_the_path(tmp_path):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(checkpoint(1), path)
    path.write_bytes(path.read_bytes()[:200])  # what a non-atomic save on a full disk leaves
    with pytest.raises(ValueError, match=f"{path} is not a readable checkpoint, truncated.*200 bytes"):
        AtomicCheckpointIO().load_checkpoint(path)


def test_loading_a_foreign_or_missing_file_names_the_path(tmp_path):
    foreign = tmp_path / "foreign.ckpt"
    torch.save([1, 2, 3], foreign)
    with pytest.raises(ValueError, match=f"{foreign} is not a Lightning checkpoint"):
        AtomicCheckpointIO().load_checkpoint(foreign)
    with pytest.raises(FileNotFoundError, match=f"no checkpoint file at {tmp_path / 'nope.ckpt'}"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "nope.ckpt")


def test_cli_refuses_a_truncated_ckpt_path_naming_it(tmp_path):
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"PK\x03\x04" + b"\0" * 50)  # a zip header cut short
    with pytest.raises(ValueError, match=f"--ckpt_path: {path} is not a readable checkpoint"):
        cli_main(
            [
                "fit",
                "--config",
                CONFIG,
                "--data.env_id",
                "tests.fake_envs:Fault-v0",
                "--ckpt_path",
                str(path),
                "--trainer.default_root_dir",
                str(tmp_path),
            ],
        )


def test_cli_installs_atomic_checkpoints_and_preemption_by_default(tmp_path):
    from fastlight.callbacks.preemption import PreemptionCheckpoint

    cli = cli_main(
        [
            "--config",
            CONFIG,
            "--data.env_id",
            "tests.fake_envs:Fault-v0",
            "--trainer.default_root_dir",
            str(tmp_path),
        ],
        run=False,
    )
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    [cb] = [c for c in cli.trainer.callbacks if isinstance(c, PreemptionCheckpoint)]
    assert cb.ckpt_path == os.path.join(str(tmp_path), "checkpoints", "last.ckpt")
    assert cb.every_minutes == 30.0
