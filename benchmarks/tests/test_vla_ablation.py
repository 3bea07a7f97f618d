"""benchmarks.vla.ablation: the arms' commands, the single-task RL config, and the pooled paired interval."""

from __future__ import annotations

import argparse

import numpy as np
import yaml

from benchmarks.vla import ablation


def test_one_task_drops_dwr_and_mt10_keeps_it(tmp_path):
    one = yaml.safe_load(ablation.rl_config("push-v3", tmp_path / "one").read_text())
    names = [c["class_path"] for c in one["trainer"]["callbacks"]]
    assert "fastlight.DynamicWeightedResampling" not in names and "fastlight.WeightSync" in names
    assert one["data"]["init_args"]["env_kwargs"]["tasks"] == "push-v3"
    mt10 = yaml.safe_load(ablation.rl_config("MT10", tmp_path / "all").read_text())
    assert "fastlight.DynamicWeightedResampling" in [c["class_path"] for c in mt10["trainer"]["callbacks"]]


def test_each_arm_differs_from_the_others_only_by_its_own_flags(tmp_path):
    args = argparse.Namespace(minutes=5, sft="s.ckpt", tasks="push-v3", demos_per_task=1, rl_flag=["--x=1"],
                              sft_flag=["--model.bin_sigma=16"])  # fmt: skip
    cmds = {
        arm: ablation.arm_command(arm, args, 3, tmp_path / arm, tmp_path / "rl.yaml") for arm in ablation.ARMS
    }
    for cmd in cmds.values():
        assert (
            cmd[cmd.index("--model.init_from") + 1] == "s.ckpt"
            and cmd[cmd.index("--seed_everything") + 1] == "3"
        )
        assert cmd[cmd.index("--trainer.max_time") + 1] == "00:00:05:00"
    assert cmds["rl_only"][-3:] == ["--model.sil_steps", "0", "--x=1"]
    assert cmds["sil_only"][-3:] == ["--model.lr", "1e-30", "--x=1"] and cmds["rl_sil"][-1] == "--x=1"
    assert "configs/vla_metaworld_mt10_sft.yaml" in " ".join(cmds["sft_continued"])
    assert cmds["sft_continued"][-1] == "--model.bin_sigma=16" and "--x=1" not in cmds["sft_continued"]


def test_paired_interval_is_the_pooled_mean_difference_and_brackets_it():
    rng = np.random.default_rng(0)
    a = (rng.random((2, 3, 40)) < 0.3).astype(float)  # [seeds, tasks, episodes]
    b = (rng.random((3, 3, 40)) < 0.6).astype(float)
    d, lo, hi = ablation.paired_ci(a, b, n_boot=2000)
    assert d == b.mean(0).mean() - a.mean(0).mean()
    assert lo < d < hi and lo > 0  # 0.3 -> 0.6 over 120 paired episodes: the interval excludes 0
    same, lo0, hi0 = ablation.paired_ci(a, a, n_boot=200)
    assert same == lo0 == hi0 == 0.0


def test_a_failed_arm_stops_the_arms_running_beside_it(tmp_path, monkeypatch):
    """No training run outlives the ablation: an arm that fails (or Ctrl-C) terminates the others."""
    import os
    import sys
    import time

    import pytest

    pid_file = tmp_path / "sleeper.pid"
    sleeper = (  # the pid appears whole (a rename), then the arm sleeps
        f"import os, time; open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid())); "
        f"os.rename({str(pid_file)!r} + '.tmp', {str(pid_file)!r}); time.sleep(120)"
    )

    # the failing arm waits for the sleeper to be running, then fails
    failing = (
        f"import os, time\nwhile not os.path.exists({str(pid_file)!r}): time.sleep(0.05)\nraise SystemExit(3)"
    )

    def fake_command(arm, args, seed, root, config):
        return [sys.executable, "-c", failing if arm == "sil_only" else sleeper]

    monkeypatch.setattr(ablation, "arm_command", fake_command)
    argv = ["--sft", "s.ckpt", "--tasks", "push-v3", "--minutes", "1", "--seeds", "0", "--parallel", "2",
            "--arms", "sil_only", "rl_only", "--runs", str(tmp_path / "runs"),
            "--out", str(tmp_path / "r")]  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(SystemExit, match="sil_only-s0 failed"):
        ablation.main(argv)
    assert time.monotonic() - t0 < 60
    pid = int(pid_file.read_text())  # written before the failing arm exited
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
