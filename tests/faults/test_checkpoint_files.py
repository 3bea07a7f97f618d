"""Atomic, checksummed checkpoint files: a save that fails on a real full filesystem (the real
``torch.save``, not an injected error) is one line naming the path, the free space and the last good
checkpoint, and leaves the previous file intact and no partial file behind; a corrupted file is
refused in one line naming it, wherever a checkpoint is read; a truncated or foreign file names the
path and what is wrong."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import resource
import signal
import sys
from pathlib import Path

import pytest
import torch

from fastlight.checkpoints import (
    CHECKSUM_PREFIX,
    AtomicCheckpointIO,
    CheckpointWriteError,
    read_checkpoint,
    verify_checksum,
)
from fastlight.cli import cli_main

ROOT = Path(__file__).resolve().parents[2]
CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "configs",
    "highway_dpsa.yaml",
)


def checkpoint(step: int, n: int = 1000) -> dict:
    return {"state_dict": {"w": torch.full((n,), float(step))}, "global_step": step}


def corrupt(path: Path, at: float = 0.5, nbytes: int = 64) -> None:
    """Flip ``nbytes`` bytes in the middle of the file (what a bad disk or copy leaves)."""
    data = bytearray(path.read_bytes())
    mid = int(len(data) * at)
    for i in range(mid, mid + nbytes):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_save_is_complete_checksummed_and_leaves_no_temporary_file(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "ckpts" / "last.ckpt"
    io.save_checkpoint(checkpoint(3), path)
    assert os.listdir(tmp_path / "ckpts") == ["last.ckpt"]
    assert io.load_checkpoint(path)["global_step"] == 3
    # The checksum is the archive's comment: the file is still a plain torch checkpoint.
    assert path.read_bytes()[-81:].startswith(CHECKSUM_PREFIX)
    assert verify_checksum(path) is True
    assert torch.load(path, weights_only=False, mmap=True)["global_step"] == 3
    plain = tmp_path / "plain.ckpt"
    torch.save(checkpoint(1), plain)  # another writer's file: no checksum, loaded unchecked
    assert verify_checksum(plain) is False
    assert read_checkpoint(plain)["global_step"] == 1


def test_corrupt_checkpoint_is_refused_in_one_line_naming_it(tmp_path):
    io = AtomicCheckpointIO()
    good, bad = tmp_path / "good.ckpt", tmp_path / "bad.ckpt"
    io.save_checkpoint(checkpoint(1, n=50_000), good)
    io.save_checkpoint(checkpoint(2, n=50_000), bad)
    os.utime(good, (1, 1))  # older than bad.ckpt: still offered, the only other one
    corrupt(bad)
    # Torch alone loads it without a word (its zip reader checks no CRC): the reason for the checksum.
    assert torch.load(bad, weights_only=False)["global_step"] == 2
    line = r"is corrupt: the sha256 of its contents is [0-9a-f]{16}\.\.\., not the [0-9a-f]{16}\.\.\. "
    for load, flag in (
        (lambda p: io.load_checkpoint(p), "--ckpt_path"),  # what Lightning's resume reads through
        (lambda p: read_checkpoint(p, flag="--model.init_from"), "--model.init_from"),
        (lambda p: read_checkpoint(p, flag="--ckpt"), "--ckpt"),  # fastlight evaluate
    ):
        with pytest.raises(ValueError, match=f"^{flag}: {bad} {line}") as info:
            load(bad)
        assert "\n" not in str(info.value)
        assert str(info.value).endswith(f"resume from another checkpoint, e.g. {good}")
    assert io.load_checkpoint(good)["global_step"] == 1


def test_corrupt_stable_checkpoint_offers_an_earlier_runs_file(tmp_path):
    """The CLI's layout: ``<dirpath>/last.ckpt`` is a second name of the newest run's file; when that
    file is corrupt, the line offers another run's checkpoint, never the same file's other name."""
    io = AtomicCheckpointIO()
    older, newer = tmp_path / "version_0" / "last.ckpt", tmp_path / "version_1" / "last.ckpt"
    io.save_checkpoint(checkpoint(1, n=20_000), older)
    io.save_checkpoint(checkpoint(2, n=20_000), newer)
    os.utime(older, (1, 1))
    corrupt(newer)
    os.link(newer, tmp_path / "last.ckpt")
    for name in (tmp_path / "last.ckpt", newer):
        with pytest.raises(
            ValueError, match=f"{name} is corrupt: .*; resume from another checkpoint, e.g. {older}$"
        ):
            read_checkpoint(name, flag="--ckpt_path")


def test_init_from_refuses_a_corrupt_checkpoint(tmp_path):
    from fastlight.modules.init_from import load_policy_weights
    from fastlight.modules.rl_module import RLModule

    module = RLModule(obs_dim=3, action_dim=2)
    module.configure_model()
    path = tmp_path / "sft.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {f"policy.{k}": v for k, v in
                                          module.policy.state_dict().items()}}, path)  # fmt: skip
    corrupt(path, at=0.6, nbytes=16)
    with pytest.raises(ValueError, match=f"--model.init_from: {path} is corrupt"):
        load_policy_weights(module.policy, path)


def test_evaluate_refuses_a_corrupt_checkpoint(tmp_path, capsys):
    from fastlight.evaluate import main as evaluate

    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(checkpoint(1, n=20_000), path)
    corrupt(path)
    with pytest.raises(SystemExit) as info:
        evaluate(["--ckpt", str(path), "--episodes", "1"])
    assert info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()  # one line, no traceback
    assert line.startswith(
        f"fastlight evaluate: error: --ckpt: {path} is corrupt: the sha256 of its contents"
    )


def private_tmpfs(folder: Path, size: int) -> None:
    """Mount a ``size``-byte tmpfs at ``folder`` in a new mount namespace of this (forked, single
    threaded) process: as root, or as any user where user namespaces are allowed. Raises OSError."""
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newns, clone_newuser, ms_rec, ms_private = 0x00020000, 0x10000000, 0x4000, 1 << 18
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(clone_newns | (clone_newuser if uid else 0)) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    if uid:  # become root of the new user namespace, which may then mount in its mount namespace
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    if libc.mount(b"none", b"/", None, ms_rec | ms_private, None) != 0:  # nothing leaks to the host
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    if libc.mount(b"fastlight-test", os.fsencode(folder), b"tmpfs", 0, f"size={size}".encode()) != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs on {folder}")


def save_on_small_disk(folder: Path, *, fsize: bool) -> dict:
    """In a forked child: on a private 1 MiB tmpfs at ``folder`` (or, with ``fsize`` or where none can
    be mounted, under a 1 MiB RLIMIT_FSIZE), save a small checkpoint, then one of 3.8 MiB, with the
    real torch.save; returns what the error said (``mode``: the limit that applied)."""
    small = {"state_dict": {"w": torch.zeros(1000)}, "global_step": 1}
    big = {"state_dict": {"w": torch.randn(1_000_000)}, "global_step": 2}  # made here: no OpenMP in the child
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave at once (no pytest teardown here)
        try:
            os.close(read)
            mode = "file size limit"
            if not fsize:
                try:
                    private_tmpfs(folder, 1 << 20)
                    mode = "full tmpfs"
                except OSError as e:
                    print(f"no private tmpfs ({e}); a file size limit instead", file=sys.stderr)
            if mode == "file size limit":  # the kernel says EFBIG, not ENOSPC
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
            io = AtomicCheckpointIO()
            path = folder / "run" / "last.ckpt"
            io.save_checkpoint(small, path)
            try:
                io.save_checkpoint(big, path)
                out = {"mode": mode, "saved": True}
            except CheckpointWriteError as e:
                files = sorted(os.listdir(path.parent))
                step = io.load_checkpoint(path)["global_step"]
                out = {"mode": mode, "errno": e.errno, "line": e.strerror, "files": files, "step": step}
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out = {"error": repr(e)}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return json.loads(text)


@pytest.mark.parametrize("limit", ["full tmpfs", "file size limit"])
def test_full_disk_is_one_line_with_path_free_space_and_last_good(tmp_path, limit):
    """The real torch.save on a full filesystem: its ``RuntimeError ... unexpected pos`` is turned
    back into the OSError, with the path, the space needed and free, and the checkpoint to resume
    from. "full tmpfs" needs a private mount namespace (root, or user namespaces); where neither is
    allowed it runs as "file size limit" (RLIMIT_FSIZE, which the kernel reports as EFBIG)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    out = save_on_small_disk(folder, fsize=limit == "file size limit")
    assert "line" in out, out
    full = out["mode"] == "full tmpfs"
    assert out["errno"] == (errno.ENOSPC if full else errno.EFBIG)
    path = folder / "run" / "last.ckpt"
    what = "No space left on device (ENOSPC)" if full else "File too large (EFBIG)"
    assert out["line"].startswith(f"could not save checkpoint {path}: {what}; it needs about 3.8 MiB, ")
    free = r"[0-9.]+ (B|KiB|MiB|GiB) free of [0-9.]+ (KiB|MiB|GiB)"
    assert re.search(f", {free} on the filesystem of {path.parent}; ", out["line"]), out["line"]
    assert out["line"].endswith(f"; last good checkpoint to resume from: {path} (unchanged)")
    assert out["files"] == ["last.ckpt"]  # no partial temporary file left
    assert out["step"] == 1  # the previous checkpoint is whole and still loads
    if full:  # the tmpfs itself: 1 MiB, less the first checkpoint (the partial file is removed)
        assert re.search(r", [0-9.]+ KiB free of 1\.0 MiB on", out["line"]), out["line"]
    if limit == "full tmpfs" and not full:
        print("no private tmpfs here: the file size limit was used instead")


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


def test_the_command_exits_1_on_a_write_error_printing_its_line_once(capsys):
    """``fastlight fit``'s exit on a full disk: status 1, no traceback, the line once (the stop line
    of PreemptionCheckpoint has it already when it reported it)."""
    from fastlight.cli_output import one_line_errors

    line = "could not save checkpoint /x/last.ckpt: No space left on device (ENOSPC); ..."
    for reported, printed in ((False, [f"fastlight: error: {line}"]), (True, [])):
        error = CheckpointWriteError(errno.ENOSPC, line)
        error.reported = reported
        with pytest.raises(SystemExit) as info, one_line_errors():
            raise error
        assert info.value.code == 1
        assert capsys.readouterr().err.splitlines() == printed
