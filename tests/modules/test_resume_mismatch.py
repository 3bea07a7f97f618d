"""Resuming (``--ckpt_path``) with a model or an env the checkpoint's weights do not fit stops in one
line naming the setting that differs and the first tensor that does not fit, before any sampler
starts, instead of torch's ``size mismatch`` traceback of every tensor."""

from __future__ import annotations

import multiprocessing
import re
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from fastlight import cli
from fastlight.cli import cli_main
from fastlight.modules.checkpointing import check_weights_fit
from fastlight.modules.rl_module import RLModule

ROOT = Path(__file__).resolve().parents[2]
FIXED = "tests.fake_envs:FixedLength-v0"  # obs (3,), 2 discrete actions
ECHO = "tests.fake_envs:ActionEcho-v0"  # obs (6,), continuous actions


def settings(root: Path, *extra: str) -> list[str]:
    return [
        "--config", str(ROOT / "configs" / "highway_dpsa.yaml"), "--data.env_id", FIXED,
        "--data.num_envs", "1", "--data.num_workers", "1", "--data.max_horizon", "4",
        "--model.update_epochs", "1", "--model.num_minibatches", "1", "--model.hidden_sizes", "[16, 16]",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root), *extra,
    ]  # fmt: skip


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """What Lightning writes for the CLI's model and DataModule (weights, both hparams), without
    training: the refusal comes before anything the training state would add matters."""
    built = cli_main(settings(tmp_path / "first"), run=False)
    built.model.configure_model()
    path = tmp_path / "last.ckpt"
    torch.save(
        {
            "state_dict": built.model.state_dict(),
            RLModule.CHECKPOINT_HYPER_PARAMS_KEY: dict(built.model.hparams),
            "datamodule_hyper_parameters": dict(built.datamodule.hparams),
            "epoch": 0,
            "global_step": 0,
            "pytorch-lightning_version": L.__version__,
        },
        path,
    )
    return path


def test_another_hidden_size_is_refused_naming_the_flag_and_the_tensor(tmp_path, checkpoint):
    with pytest.raises(ValueError) as e:
        cli_main(
            [
                "fit",
                *settings(tmp_path / "run", "--model.hidden_sizes", "[64, 64]"),
                "--ckpt_path",
                str(checkpoint),
            ]
        )
    assert str(e.value) == (
        f"--ckpt_path {checkpoint}: --model.hidden_sizes [64, 64] (checkpoint: [16, 16]): the checkpoint's "
        "weights cannot be loaded into this model (policy.actor.0.weight is [64, 3] here, [16, 3] in the "
        "checkpoint; 9 more tensors differ); resume with the checkpoint's settings, or start a new run "
        "without --ckpt_path"
    )
    # Stopped before training: no sampler was started, no checkpoint written.
    assert multiprocessing.active_children() == []
    assert not (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()


def test_another_env_through_the_command_is_one_error_line(tmp_path, checkpoint, monkeypatch, capsys):
    argv = [
        "fastlight",
        "fit",
        *settings(tmp_path / "run", "--data.env_id", ECHO),
        "--ckpt_path",
        str(checkpoint),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("fastlight: error:")]
    assert errors == [
        f"fastlight: error: --ckpt_path {checkpoint} was trained on {FIXED}, not on this run's --data.env_id "
        f"{ECHO}: resume it with --data.env_id {FIXED}, or give a run of {ECHO} a root of its own "
        "(--trainer.default_root_dir) so that `--ckpt_path last` finds its own checkpoints  "
        "(FASTLIGHT_DEBUG=1 shows the traceback)"
    ]
    assert "Traceback" not in err and "size mismatch" not in err


def test_last_in_a_root_another_env_wrote_is_refused(tmp_path, checkpoint):
    """`--ckpt_path last` reads <root>/checkpoints/last.ckpt: a run of another env that shares the root
    (a config reused for a user's own env) is refused, however well its weights would fit."""
    root = tmp_path / "shared"
    (root / "checkpoints").mkdir(parents=True)
    (root / "checkpoints" / "last.ckpt").write_bytes(checkpoint.read_bytes())
    same_sizes = "tests.fake_envs:Crashing-v0"  # another env of the same sizes: the weights would load
    line = f"--ckpt_path {root}/checkpoints/last.ckpt was trained on {FIXED}, not on this run's"
    with pytest.raises(ValueError, match="^" + re.escape(line)):
        cli_main(["fit", *settings(root, "--data.env_id", same_sizes), "--ckpt_path", "last"])
    assert multiprocessing.active_children() == []


def test_the_same_settings_resume_without_a_word(tmp_path, checkpoint):
    module = RLModule(obs_dim=3, action_dim=2, hidden_sizes=(16, 16))
    module.configure_model()
    ckpt = torch.load(checkpoint, weights_only=False)
    check_weights_fit(module, ckpt)  # fits: nothing raised
    module.load_state_dict(ckpt["state_dict"])  # and torch agrees
    narrow = RLModule(obs_dim=3, action_dim=2, hidden_sizes=(8, 8))
    narrow.configure_model()
    with pytest.raises(ValueError, match=r"^--model.hidden_sizes \[8, 8\] \(checkpoint: \[16, 16\]\): "):
        check_weights_fit(narrow, ckpt)  # no Trainer: no --ckpt_path to name
