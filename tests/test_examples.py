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
            "17",  # 2 rollouts: the first one's 16 optimizer steps, then the second rollout
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
    # Every rollout is logged (log_every_n_steps: 1; Lightning's default 50 counts rollouts here and
    # would log only the run's last one).
    assert cli.model.policy_version == 2
    assert logged_steps(tmp_path / "csv" / "version_0" / "metrics.csv", "rollout/valid_steps") == 2
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
    # TensorBoard holds every rollout (not only hp_metric and the run's last step).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(trainer.logger.log_dir)
    events.Reload()
    assert len(events.Scalars("rollout/valid_steps")) == 3
    assert len(events.Scalars("perf/effective_tps")) == 2  # from the second rollout on


def logged_steps(metrics_csv, key: str) -> int:
    """Rows of a CSVLogger's metrics.csv where ``key`` has a value."""
    import csv

    with open(metrics_csv) as f:
        return sum(1 for row in csv.DictReader(f) if row.get(key))
