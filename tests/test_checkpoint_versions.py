"""One checkpoint folder per run, and one ``last.ckpt``: runs that share a root dir never mix their
files, ``<root>/checkpoints/last.ckpt`` is the latest run's newest checkpoint (PreemptionCheckpoint
its only writer), and ``--ckpt_path last`` / that path resume into the next version."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from jsonargparse import Namespace
from torch.utils.data import DataLoader

from fastlight.callbacks.preemption import Preempted, PreemptionCheckpoint
from fastlight.cli_defaults import (
    ENV_STEPS,
    LOST_RANK,
    MODEL_CHECKPOINT,
    PREEMPTION,
    next_version,
    run_defaults,
)
from tests.faults.test_preemption import (  # noqa: F401 - python_sigint is a fixture
    STEPS_PER_UPDATE,
    Rollouts,
    SignalInUpdate,
    python_sigint,
    saved_step,
    trainer,
)

ROOT = Path(__file__).resolve().parents[1]


def test_each_run_writes_its_version_and_last_ckpt_is_the_latest_runs(tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    torch.save({"global_step": 1, "state_dict": {}}, ckpts / "last.ckpt")  # from before versioned folders
    for version, updates in ((0, 2), (1, 3)):
        cb = PreemptionCheckpoint(every_minutes=None, version=version)
        trainer(tmp_path, cb, max_steps=updates * STEPS_PER_UPDATE).fit(
            SignalInUpdate(), DataLoader(Rollouts(50), batch_size=None)
        )
        assert cb.ckpt_path == str(ckpts / "last.ckpt")  # the stable path, what the stop line names
        assert cb.run_ckpt_path == str(ckpts / f"version_{version}" / "last.ckpt")
        assert os.path.samefile(cb.ckpt_path, cb.run_ckpt_path)
    assert sorted(os.listdir(ckpts)) == ["last-before-version_0.ckpt", "last.ckpt", "version_0", "version_1"]
    assert saved_step(ckpts / "last-before-version_0.ckpt") == 1  # kept, not overwritten
    assert saved_step(ckpts / "version_0" / "last.ckpt") == 2 * STEPS_PER_UPDATE
    assert saved_step(ckpts / "last.ckpt") == 3 * STEPS_PER_UPDATE  # the second run's
    # A plain file, not a symlink: moved elsewhere (an SFT checkpoint handed on), it still loads.
    assert not os.path.islink(ckpts / "last.ckpt")
    os.replace(ckpts / "last.ckpt", tmp_path / "moved.ckpt")
    assert saved_step(tmp_path / "moved.ckpt") == 3 * STEPS_PER_UPDATE


def test_a_shorter_run_never_takes_last_ckpt_from_a_longer_one(tmp_path, capsys):
    """A quick look after a long run (or a run that fails early) writes its own version; last.ckpt keeps
    naming the longer run's checkpoint, and the end line names this run's file instead."""
    ckpts = tmp_path / "checkpoints"
    for version, updates in ((0, 5), (1, 2)):
        cb = PreemptionCheckpoint(every_minutes=None, version=version)
        trainer(tmp_path, cb, max_steps=updates * STEPS_PER_UPDATE).fit(
            SignalInUpdate(), DataLoader(Rollouts(50), batch_size=None)
        )
    assert os.path.samefile(ckpts / "last.ckpt", ckpts / "version_0" / "last.ckpt")
    assert saved_step(ckpts / "version_1" / "last.ckpt") == 2 * STEPS_PER_UPDATE  # written all the same
    assert cb.resume_path == str(ckpts / "version_1" / "last.ckpt")
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (
        f"fastlight: {ckpts / 'last.ckpt'} still names a longer run's checkpoint (global step 10, this "
        f"run's 4); this run's is {ckpts / 'version_1' / 'last.ckpt'}"
    )
    # A third run that goes further takes it, at its first save past the longer run's step.
    cb = PreemptionCheckpoint(every_minutes=None, version=2, every_epoch=True)
    trainer(tmp_path, cb, max_steps=6 * STEPS_PER_UPDATE, limit_train_batches=3).fit(
        SignalInUpdate(), DataLoader(Rollouts(50), batch_size=None)
    )
    assert os.path.samefile(ckpts / "last.ckpt", ckpts / "version_2" / "last.ckpt")
    assert sorted(os.listdir(ckpts)) == ["last.ckpt", "version_0", "version_1", "version_2"]


@pytest.mark.usefixtures("python_sigint")
def test_a_run_that_completes_no_update_writes_no_checkpoint(tmp_path, capsys):
    ckpts = tmp_path / "checkpoints"
    cb = PreemptionCheckpoint(every_minutes=None, version=0)
    trainer(tmp_path, cb, max_steps=2 * STEPS_PER_UPDATE).fit(
        SignalInUpdate(), DataLoader(Rollouts(50), batch_size=None)
    )
    cb = PreemptionCheckpoint(every_minutes=None, version=1)
    with pytest.raises(Preempted):  # stopped while it waits for its first batch
        trainer(tmp_path, cb, max_steps=100).fit(
            SignalInUpdate(signum=signal.SIGTERM, wait_at=0), DataLoader(Rollouts(50), batch_size=None)
        )
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (
        "fastlight: stopped by SIGTERM at global step 0 before this run's first update; no checkpoint written"
    )
    assert os.listdir(ckpts / "version_1") == []
    assert os.path.samefile(ckpts / "last.ckpt", ckpts / "version_0" / "last.ckpt")


def test_next_version_is_past_every_checkpoint_and_log_folder(tmp_path):
    assert next_version(str(tmp_path)) == 0
    for folder in ("checkpoints/version_0", "checkpoints/version_2", "tb/version_4", "csv/version_x"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "checkpoints" / "version_9.ckpt").touch()  # a file, not a run's folder
    assert next_version(str(tmp_path)) == 5


def fit_config(root: Path, callbacks: list[Namespace], **extra) -> Namespace:
    return Namespace(trainer=Namespace(default_root_dir=str(root), callbacks=callbacks, logger=None), **extra)


def test_run_defaults_place_every_file_of_the_run_and_are_idempotent(tmp_path):
    own = str(tmp_path / "mine")
    cfg = fit_config(
        tmp_path,
        [
            Namespace(class_path=MODEL_CHECKPOINT, init_args=Namespace(dirpath=None, save_last=True)),
            Namespace(class_path=MODEL_CHECKPOINT, init_args=Namespace(dirpath=own, save_last=True)),
        ],
        ckpt_path="last",
    )
    done = run_defaults(cfg, version=3, last_exists=True)
    assert cfg.trainer.callbacks[0].init_args.dirpath is None and cfg.ckpt_path == "last"  # a copy
    placed, mine, preemption, lost_rank, env_steps = done.trainer.callbacks
    assert placed.init_args == Namespace(dirpath=str(tmp_path / "checkpoints" / "version_3"), save_last=False)
    assert mine.init_args == Namespace(dirpath=own, save_last=True)  # a folder of the config's own: as it is
    added = (preemption.class_path, lost_rank.class_path, env_steps.class_path)
    assert added == (PREEMPTION, LOST_RANK, ENV_STEPS)
    assert preemption.init_args.dirpath == str(tmp_path / "checkpoints")
    assert preemption.init_args.version == 3
    assert preemption.init_args.every_epoch is True  # save_last's stand-in
    assert done.ckpt_path == str(tmp_path / "checkpoints" / "last.ckpt")
    loggers = [(lg.init_args.name, lg.init_args.version) for lg in done.trainer.logger]
    assert loggers == [("tb", 3), ("csv", 3)]
    assert run_defaults(done, version=4, last_exists=True) == done  # e.g. the saved config.yaml's dump
    fresh = run_defaults(fit_config(tmp_path, [], ckpt_path="last"), version=0, last_exists=False)
    assert fresh.ckpt_path == "last"  # no checkpoint yet: Lightning's (start afresh, e.g. a requeued job)
    assert fresh.trainer.callbacks[0].init_args.every_epoch is False


def tiny_fit(root: Path) -> list[str]:
    """``fastlight fit`` of the highway config on the fault env, one tiny sampler, into ``root``."""
    return [
        "fit", "--config", str(ROOT / "configs" / "highway_dpsa.yaml"),
        "--data.env_id", "tests.fake_envs:Fault-v0",
        "--data.num_envs", "2", "--data.num_workers", "1", "--data.max_horizon", "8",
        "--data.steps_per_epoch", "1", "--model.update_epochs", "1", "--model.num_minibatches", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root),
    ]  # fmt: skip


@pytest.mark.multiproc
def test_two_cli_runs_with_one_root_dir(tmp_path, capsys):
    """Two runs: two version folders, and last.ckpt the second run's (a resume by --ckpt_path last,
    with a learning rate typed then); no last-v1.ckpt anywhere."""
    from fastlight.cli import cli_main

    root = tmp_path / "run"
    args = tiny_fit(root)
    first = cli_main([*args, "--trainer.max_steps", "2"])
    assert first.trainer.global_step == 2
    capsys.readouterr()
    second = cli_main([*args, "--trainer.max_steps", "4", "--ckpt_path", "last", "--model.lr", "0.01"])
    assert second.trainer.global_step == 4 and second.model.policy_version == 2  # resumed at step 2
    assert "(yours apply): --model.lr 0.01 (checkpoint: 0.0005)" in capsys.readouterr().err
    ckpts = root / "checkpoints"
    assert sorted(os.listdir(ckpts)) == ["last.ckpt", "version_0", "version_1"]
    last = torch.load(ckpts / "last.ckpt", weights_only=False)
    assert last["global_step"] == 4 and last["hyper_parameters"]["lr"] == 0.01
    assert os.path.samefile(ckpts / "last.ckpt", ckpts / "version_1" / "last.ckpt")
    for version, step in ((0, 2), (1, 4)):  # each run's ModelCheckpoint file in its own folder
        names = sorted(os.listdir(ckpts / f"version_{version}"))
        assert names == ["epoch=0-step=2.ckpt" if version == 0 else "epoch=1-step=4.ckpt", "last.ckpt"], names
        assert saved_step(ckpts / f"version_{version}" / "last.ckpt") == step
    assert not list(root.rglob("last-v*.ckpt"))
    assert sorted(os.listdir(root / "tb")) == sorted(os.listdir(root / "csv")) == ["version_0", "version_1"]


@pytest.mark.multiproc
def test_a_runs_saved_config_resumes_into_a_new_version_and_the_command_lines_root(tmp_path, capsys):
    """``fit --config <root>/tb/version_0/config.yaml --ckpt_path last``: the saved config pins the first
    run's folders (loggers' version 0, the checkpoints' dirpath); the resume still writes version_1 and
    leaves every file of version_0 as it was, and a root dir typed on the command line wins."""
    from fastlight.cli import cli_main

    root = tmp_path / "run"
    cli_main([*tiny_fit(root), "--trainer.max_steps", "2"])
    saved = root / "tb" / "version_0" / "config.yaml"
    first = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and "version_0" in p.parts}
    assert saved in first and root / "csv" / "version_0" / "metrics.csv" in first
    again = cli_main(["fit", "--config", str(saved), "--ckpt_path", "last", "--trainer.max_steps", "4"])
    assert again.trainer.global_step == 4
    assert {p: p.read_bytes() for p in first} == first  # nothing of version_0 rewritten
    assert sorted(os.listdir(root / "tb")) == sorted(os.listdir(root / "csv")) == ["version_0", "version_1"]
    assert saved_step(root / "checkpoints" / "version_1" / "last.ckpt") == 4
    elsewhere = tmp_path / "elsewhere"
    cli_main(["fit", "--config", str(saved), "--trainer.default_root_dir", str(elsewhere)])  # max_steps 2
    assert sorted(os.listdir(elsewhere / "checkpoints")) == ["last.ckpt", "version_0"]
    assert sorted(os.listdir(root / "tb")) == ["version_0", "version_1"]  # the first root untouched


@pytest.mark.parametrize(
    "data, counted",
    [
        ("fastlight.RolloutDataModule", True),
        ("fastlight.vla.demos.DemoDataModule", False),  # a supervised stage: no env steps to count
    ],
)
def test_env_steps_are_counted_for_rollout_data_only(tmp_path, data, counted):
    cfg = fit_config(tmp_path, [], data=Namespace(class_path=data, init_args=Namespace()))
    paths = [cb.class_path for cb in run_defaults(cfg, version=0, last_exists=False).trainer.callbacks]
    assert (ENV_STEPS in paths) == counted and PREEMPTION in paths and LOST_RANK in paths
