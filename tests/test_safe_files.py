"""Files a user is handed run no code: a pickle payload in a checkpoint or a demo cache, through every
path that reads one (``fastlight evaluate``, ``--ckpt_path``, ``--model.init_from``, Lightning's
CheckpointIO, the demo cache, the class a checkpoint names, saved env states), writes no marker and is
refused in one line naming the file and what it asks to import, also with a valid checksum."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from fastlight.checkpoints import AtomicCheckpointIO, read_checkpoint, verify_checksum
from fastlight.cli import cli_main
from fastlight.safe_files import UnsafeFileError, local_mac, safe_load, signed_here

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "highway_dpsa.yaml")


class Payload:
    """Unpickled, it calls ``open(marker, "w")``: the marker file appears when code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        return (open, (str(self.marker), "w"))


def planted(tmp_path: Path, **extra) -> tuple[Path, Path]:
    """``(checkpoint with a payload and a valid fastlight checksum, its marker)``."""
    marker = tmp_path / "ran"
    path = tmp_path / "shared" / "last.ckpt"
    ckpt = {"state_dict": {"w": torch.zeros(3)}, "global_step": 5, "evil": Payload(marker), **extra}
    AtomicCheckpointIO().save_checkpoint(ckpt, path)  # an attacker computes the checksum too
    assert verify_checksum(path) is True
    return path, marker


def test_the_payload_is_live_so_the_tests_below_can_fail(tmp_path):
    path, marker = planted(tmp_path)
    torch.load(path, weights_only=False)  # what every path did before
    assert marker.exists()


def test_every_checkpoint_reader_refuses_the_payload_naming_what_it_imports(tmp_path):
    path, marker = planted(tmp_path)
    for load in (
        lambda: read_checkpoint(path, flag="--ckpt"),
        lambda: AtomicCheckpointIO().load_checkpoint(path),  # Lightning's resume reads through it
        lambda: AtomicCheckpointIO().load_checkpoint(path, weights_only=False),  # asked for, not given
        lambda: safe_load(path, flag="--x"),
    ):
        with pytest.raises(UnsafeFileError) as info:
            load()
        [line] = str(info.value).splitlines()
        assert f"{path} is refused: it asks to import io.open, and loading it would run that code" in line
        assert not marker.exists()


def test_evaluate_refuses_the_payload_in_one_line(tmp_path, capsys):
    from fastlight.evaluate import main as evaluate

    path, marker = planted(tmp_path)
    with pytest.raises(SystemExit) as info:
        evaluate(["--ckpt", str(path), "--episodes", "1"])
    assert info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"fastlight evaluate: error: --ckpt: {path} is refused: it asks to import")
    assert not marker.exists()


@pytest.mark.parametrize("flag", ["--ckpt_path", "--model.init_from"])
def test_fit_refuses_the_payload_before_training(tmp_path, flag):
    path, marker = planted(tmp_path)
    args = ["fit", "--config", CONFIG, "--data.env_id", "tests.fake_envs:Fault-v0", flag, str(path)]
    args += ["--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.max_steps", "4"]
    with pytest.raises(UnsafeFileError, match=f"{flag}: {path} is refused"):
        cli_main(args)
    assert not marker.exists()
    assert not list((tmp_path / "run").rglob("*.ckpt"))  # it trained nothing


def test_a_checkpoint_naming_a_non_module_class_never_calls_it(tmp_path):
    from fastlight.modules.loading import load_module_of

    marker = tmp_path / "called"
    path = tmp_path / "x.ckpt"
    ckpt = {"state_dict": {}, "hyper_parameters": {"_class_path": "builtins.open", "file": str(marker)}}
    AtomicCheckpointIO().save_checkpoint(ckpt, path)
    with pytest.raises(ValueError, match="cannot import the checkpoint's module class 'builtins.open'"):
        load_module_of(path, read_checkpoint(path))
    assert not marker.exists()


def test_a_demo_cache_with_a_payload_is_refused(tmp_path):
    from fastlight.vla.demos import DemoSettings, load_demos

    marker = tmp_path / "ran"
    path = tmp_path / "demos.pt"
    torch.save({"settings": {}, "demos": Payload(marker)}, path)
    with pytest.raises(UnsafeFileError, match=f"demo cache {path}: {path} is refused"):
        load_demos(
            path,
            DemoSettings("x", {}, demos_per_task=1, seed=0, successful_only=True, max_attempts_per_demo=1),
        )
    assert not marker.exists()


def test_env_states_are_unpickled_only_under_this_users_key(tmp_path, monkeypatch):
    from fastlight.data.exact_resume import states_from_plain, states_to_plain
    from fastlight.sampling.exact import SamplerState

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "me"))
    blob = b"pickled envs"
    plain = states_to_plain({0: SamplerState(3, 2, 1, envs=blob), 1: SamplerState(3, 2, 1)})
    assert (tmp_path / "me" / "fastlight" / "resume.key").stat().st_mode & 0o777 == 0o600
    states, unsigned = states_from_plain(plain)
    assert states[0].envs == blob and states[0].exact and unsigned == []
    # Another user's key (or a forged HMAC): the blob is never handed to pickle.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "someone-else"))
    states, unsigned = states_from_plain(plain)
    assert states[0].envs is None and not states[0].exact and unsigned == [0]
    assert states[1].envs is None and states[1].exact  # nothing saved there, nothing dropped
    assert not signed_here(blob, None)


def test_the_key_is_made_once_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    first = local_mac(b"x")
    assert local_mac(b"x") == first and local_mac(b"y") != first
    assert len((tmp_path / "fastlight" / "resume.key").read_bytes()) == 32
    assert not [n for n in os.listdir(tmp_path / "fastlight") if n.startswith(".")]  # no temporary left
