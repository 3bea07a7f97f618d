"""The examples run and log what they claim: the subclass through the CLI, the callbacks attached to a plain
Trainer, the plain Lightning PPO project and its two fastlight steps (whose README diffs stay exact)."""

from __future__ import annotations

import os
import re
import sys
import warnings

import pytest
import torch

from fastlight.cli import cli_main, main

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


@pytest.mark.multiproc
def test_a_users_own_vla_class_trains_through_fastlight_fit(tmp_path):
    """examples/hf_vla: a GPT-2 + action head the user already had, wrapped as a TokenPolicy, trained by
    VLAModule (GIPO, value-head lr, self-imitation on) on Meta-World reach through the CLI."""
    import csv
    import math

    from examples.hf_vla.policy import MyVLAPolicy
    from fastlight.models.base import TokenPolicy
    from fastlight.modules.loading import load_module

    cli = cli_main(
        ["fit", "--config", os.path.join(ROOT, "examples", "hf_vla", "reach.yaml"),
         "--trainer.max_steps", "8",  # 2 updates of update_epochs x num_minibatches = 4 optimizer steps
         "--data.num_envs", "2", "--data.num_workers", "1", "--data.max_horizon", "10",
         "--data.env_kwargs.max_path_length", "10", "--trainer.enable_progress_bar", "false",
         "--trainer.default_root_dir", str(tmp_path)]
    )  # fmt: skip
    policy = cli.model.policy
    assert type(policy) is MyVLAPolicy and isinstance(policy, TokenPolicy)
    assert cli.model.policy_version == 2
    groups = {g["name"]: g for g in cli.model.optimizers()[0].param_groups}
    assert groups["value_head"]["lr"] == 1e-3 and groups["policy"]["lr"] == 3e-4
    assert {id(p) for p in groups["value_head"]["params"]} == {id(p) for p in policy.critic.parameters()}
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("loss/total")]
    assert len(rows) == 2 and all(math.isfinite(float(r["loss/total"])) for r in rows)
    assert all(r["sil/buffer_steps"] != "" for r in rows)  # self-imitation is on (its buffer is logged)
    # The checkpoint rebuilds the user's class with the trained weights (what `fastlight evaluate` loads).
    loaded = load_module(tmp_path / "checkpoints" / "last.ckpt").policy
    assert type(loaded) is MyVLAPolicy
    for (name, a), b in zip(policy.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a.cpu(), b), name


def logged_steps(metrics_csv, key: str) -> int:
    """Rows of a CSVLogger's metrics.csv where ``key`` has a value."""
    import csv

    with open(metrics_csv) as f:
        return sum(1 for row in csv.DictReader(f) if row.get(key))


# ---------------------------------------------------------------- a plain Lightning project, then fastlight
PLAIN = os.path.join(ROOT, "examples", "plain_ppo")


def _apply_unified_diff(diff: str) -> tuple[str, str, str]:
    """Apply a ``diff -u`` text to the file it names; returns (old path, new path, patched text)."""
    lines = diff.splitlines(keepends=True)
    old_path, new_path = lines[0][4:].strip(), lines[1][4:].strip()
    old = open(os.path.join(ROOT, old_path)).read().splitlines(keepends=True)
    out: list[str] = []
    at = 0  # next unread line of the old file
    i = 2
    while i < len(lines):
        header = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", lines[i])
        assert header, f"not a hunk header: {lines[i]!r}"
        start = int(header[1]) - 1 if header[2] != "0" else int(header[1])
        out += old[at:start]
        at = start
        i += 1
        while i < len(lines) and not lines[i].startswith("@@"):
            tag, text = lines[i][0], lines[i][1:]
            if tag in " -":
                assert old[at] == text, f"{old_path}:{at + 1} is {old[at]!r}, the diff expects {text!r}"
                at += 1
            if tag in " +":
                out.append(text)
            i += 1
    return old_path, new_path, "".join(out + old[at:])


def test_readme_diffs_turn_each_plain_ppo_file_into_the_next():
    readme = open(os.path.join(ROOT, "README.md")).read()
    diffs = [d for d in re.findall(r"```diff\n(.*?)```", readme, flags=re.S) if "examples/plain_ppo" in d]
    pairs = []
    for diff in diffs:
        old_path, new_path, patched = _apply_unified_diff(diff)
        assert patched == open(os.path.join(ROOT, new_path)).read(), f"README's diff to {new_path} is stale"
        pairs.append((os.path.basename(old_path), os.path.basename(new_path)))
    assert pairs == [("ppo.py", "ppo_callbacks.py"), ("ppo_callbacks.py", "ppo_fastlight.py")]


def test_plain_ppo_and_its_callbacks_version_log_what_they_claim(tmp_path):
    from examples.plain_ppo import ppo, ppo_callbacks

    plain = ppo.main(max_steps=8, root=str(tmp_path / "plain"))  # one epoch: 512 steps, 8 minibatches
    losses = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "charts/episodic_return")
    assert set(losses) <= set(plain.logged_metrics)
    assert not any(k.startswith("perf/") for k in plain.logged_metrics)

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # counted through batch_counts_fn: no warning
        warnings.filterwarnings("ignore", message=".*(log_every_n_steps|num_workers|LeafSpec).*")
        attached = ppo_callbacks.main(max_steps=8, root=str(tmp_path / "callbacks"))
    m = {k: float(v) for k, v in attached.logged_metrics.items()}
    assert set(losses) <= set(m)
    assert m["perf/valid_steps_total"] == m["perf/raw_steps_total"] == 8 * 64
    assert m["perf/effective_tps"] > 0 and m["perf/raw_tps"] == m["perf/effective_tps"]
    assert m["perf/sample_efficiency"] == 1.0  # every row is a real step
    assert "perf/time_efficiency" not in m  # no sampler clocks in the plain project: not logged


@pytest.mark.slow
@pytest.mark.multiproc
def test_plain_ppo_on_rollout_datamodule_logs_losses_and_sampler_throughput(tmp_path):
    from examples.plain_ppo import ppo_fastlight

    trainer = ppo_fastlight.main(max_steps=3, root=str(tmp_path))
    assert trainer.lightning_module.policy_version == 3  # one update per Rollout, all published
    m = {k: float(v) for k, v in trainer.logged_metrics.items()}
    assert {"losses/policy_loss", "losses/value_loss", "losses/entropy"} <= set(m)
    assert 0 < m["perf/sample_efficiency"] <= 1 and m["perf/effective_tps"] > 0
    assert m["perf/valid_steps_total"] <= m["perf/raw_steps_total"]
    assert 0 < m["perf/time_efficiency"] <= 1  # the samplers' own clocks reach the callback


# ---------------------------------------------------------------- subclassing RLModule: one-line errors
SUBCLASSES = '''
from fastlight.models.mlp import MLPActorCritic
from fastlight.modules.rl_module import RLModule


class Misnamed(RLModule):
    def __init__(self, width: int = 32, **kwargs) -> None:
        super().__init__(**kwargs)
        self.widht = width  # build_policy reads self.width

    def build_policy(self):
        return MLPActorCritic(self.hparams.obs_dim, self.hparams.action_dim, hidden_sizes=(self.width,))


class PolicyInInit(RLModule):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.policy.requires_grad_(True)  # the policy is built later, in configure_model
'''


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (
            "Misnamed",
            "fastlight: error: --model.class_path user_modules.Misnamed: Misnamed.build_policy() raised "
            "AttributeError: 'Misnamed' object has no attribute 'width'. build_policy() runs in "
            "configure_model(), after __init__: set every attribute it reads in Misnamed.__init__",
        ),
        (
            "PolicyInInit",
            "fastlight: error: PolicyInInit.policy does not exist yet: it is built by configure_model()",
        ),
    ],
)
def test_subclass_mistakes_stop_the_cli_with_one_line(cls, expected, tmp_path, monkeypatch, capsys):
    (tmp_path / "user_modules.py").write_text(SUBCLASSES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FASTLIGHT_DEBUG", "0")
    argv = ["fastlight", "fit", "--model.class_path", f"user_modules.{cls}"]
    argv += ["--data.class_path", "fastlight.data.datamodule.RolloutDataModule"]
    argv += ["--data.env_id", "tests.fake_envs:FixedLength-v0"]
    argv += ["--data.num_envs", "1", "--data.num_workers", "1"]
    argv += ["--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path / "runs")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("fastlight: error:")]
    assert len(errors) == 1 and errors[0].startswith(expected), errors
    assert "Traceback" not in err
