"""The examples run: the subclass through the CLI, the callback attached to a plain Trainer."""

from __future__ import annotations

import os

import pytest
import torch

from fastlight.cli import cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.multiproc
def test_merge_subclass_runs_through_the_cli(tmp_path):
    cli = cli_main(
        [
            "fit",
            "--config",
            os.path.join(ROOT, "examples", "merge.yaml"),
            "--trainer.max_steps",
            "1",
            "--data.num_envs",
            "2",
            "--data.num_workers",
            "1",
            "--data.max_horizon",
            "4",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path),
        ]
    )
    policy = cli.model.policy
    assert type(policy).__name__ == "LayerNormMLP"
    assert policy.actor[0].weight.shape == (128, cli.datamodule.obs_dim)
    assert cli.model.hparams.width == 128 and cli.model.hparams.gamma == 0.9
    # The subclass's checkpoint rebuilds the same architecture.
    ckpt = os.path.join(tmp_path, "m.ckpt")
    cli.trainer.save_checkpoint(ckpt)
    from examples.merge_module import MergeModule

    loaded = MergeModule.load_from_checkpoint(ckpt)
    for a, b in zip(loaded.policy.parameters(), policy.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.multiproc
def test_attach_callbacks_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from examples.attach_callbacks import main

    trainer = main(max_steps=48)  # 3 rollouts: the first one only starts the throughput clock
    assert "perf/effective_tps" in trainer.logged_metrics
    assert trainer.logged_metrics["perf/effective_tps"] > 0
