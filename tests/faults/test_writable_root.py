"""A ``--trainer.default_root_dir`` that cannot be written is refused in one line, before a run starts
anything: a read-only directory (checked by a process without root's override), a path under a
file, a full filesystem; a writable one passes, and the check creates nothing."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable

import pytest

from fastlight.checkpoints import check_writable_dir
from fastlight.cli_output import setting_error_line
from tests.faults.test_log_writes import mount_tmpfs

NOBODY = 65534


def test_a_writable_root_passes_and_the_check_creates_nothing(tmp_path):
    check_writable_dir(tmp_path / "runs" / "x")  # missing yet: its existing parent is writable
    check_writable_dir(tmp_path)
    assert list(tmp_path.iterdir()) == []
    check_writable_dir("s3://bucket/runs")  # remote: Lightning's filesystem layer handles it


def test_a_root_under_a_file_is_refused_naming_the_flag(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    target = tmp_path / "notes.txt" / "run"
    with pytest.raises(ValueError) as e:
        check_writable_dir(target)
    file = tmp_path / "notes.txt"
    assert (
        str(e.value)
        == f"--trainer.default_root_dir {target}: not writable ({file} is a file, not a directory)"
    )
    assert setting_error_line(e.value) == str(e.value)  # the CLI prints it as its one line


def refusal(target: str) -> str:
    """check_writable_dir's message for ``target``, from a process without root's override: the
    tests' own when they do not run as root, else a forked child that became user nobody first."""
    if os.geteuid() != 0:
        with pytest.raises(ValueError) as e:
            check_writable_dir(target)
        return str(e.value)

    def as_nobody() -> None:
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        check_writable_dir(target)

    return said_in_child(as_nobody)


def said_in_child(body: Callable[[], None]) -> str:
    """Run ``body`` in a forked child (only plain file operations, then out without any teardown) and
    return what it raised, as text, or ``"no error"``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            body()
            said = "no error"
        except BaseException as e:  # noqa: BLE001 - whatever happened goes back to the test
            said = str(e)
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    assert os.waitpid(pid, 0)[1] == 0
    return said


def test_a_read_only_root_is_refused_naming_the_flag_and_the_cause():
    folder = tempfile.mkdtemp(prefix="fastlight-ro-")  # in /tmp, which every user may traverse
    try:
        os.chmod(folder, 0o555)
        target = os.path.join(folder, "run", "tb")
        assert refusal(target) == (
            f"--trainer.default_root_dir {target}: not writable (PermissionError: Permission denied creating "
            f"a file in {folder}); choose a directory this user can write to"
        )
        assert os.listdir(folder) == []
    finally:
        os.chmod(folder, 0o755)
        os.rmdir(folder)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs in a private namespace needs root")
def test_a_full_filesystem_is_refused_with_its_free_space(tmp_path):
    """A disk already full at the start still lets an empty file be created: the check writes. Before:
    a 68-line traceback from TensorBoard's writer in Lightning's setup."""
    disk = tmp_path / "disk"
    disk.mkdir()

    def on_a_full_disk() -> None:  # its own mount namespace with a 1 MiB tmpfs at `disk`, filled
        mount_tmpfs(disk, "1m")
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, bytes(4096))
        except OSError:
            os.close(fd)
        check_writable_dir(disk / "run")

    said = said_in_child(on_a_full_disk)
    assert re.fullmatch(
        rf"--trainer\.default_root_dir {re.escape(str(disk / 'run'))}: not writable \(OSError: No space left "
        rf"on device writing a file in {re.escape(str(disk))}; 0 B free of 1\.0 MiB on the filesystem of "
        rf"{re.escape(str(disk))}\); free space there or choose another directory",
        said,
    ), said
