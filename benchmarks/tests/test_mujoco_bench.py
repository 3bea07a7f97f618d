"""``benchmarks.mujoco``: Sample Factory's log lines and the run summary read the numbers they show."""

from __future__ import annotations

import datetime as dt

import pytest

from benchmarks.mujoco.__main__ import parse_args, parse_sf_log, summarise

LOG = (
    "\x1b[36m[2026-12-01 12:52:00,097][24162] Fps is (10 sec: 0.0, 60 sec: 0.0, 300 sec: 0.0). "
    "Total num frames: 0. Throughput: 0: 189.5. Samples: 948.\x1b[0m\n"
    "\x1b[36m[2026-12-01 12:52:00,097][24162] Avg episode reward: [(0, '17.279')]\x1b[0m\n"
    "\x1b[36m[2026-12-01 12:52:05,100][24162] Fps is (10 sec: 4915.2, 60 sec: 4915.2, 300 sec: 4915.2). "
    "Total num frames: 24576. Throughput: 0: 4800.0.\x1b[0m\n"
    "\x1b[36m[2026-12-01 12:52:05,100][24162] Avg episode reward: [(0, '120.5')]\x1b[0m\n"
    "\x1b[37m[2026-12-01 12:52:06,000][24199] Decorrelating experience for 384 frames...\x1b[0m\n"
)


def test_sf_log_gives_rewards_and_frames_against_launch_time():
    launch = dt.datetime(2026, 12, 1, 12, 51, 50).timestamp()
    s = parse_sf_log(LOG, launch)
    assert s["ret"] == [17.279, 120.5]
    assert s["t"] == pytest.approx([10.097, 15.100], abs=1e-3)
    assert s["frames"] == [0.0, 24576.0]
    summary = summarise(s, final_s=6.0, budget_s=20.0)
    assert summary["final_return"] == 120.5  # the last 6 s of 20: the report at 15.1 s only
    assert summary["env_steps_per_s"] == pytest.approx(24576 / 5.003, rel=1e-3)
    assert summary["first_report_s"] == pytest.approx(10.097, abs=1e-3)


def test_summary_ignores_reports_past_the_budget():
    s = {
        "t": [10.0, 50.0, 70.0],
        "ret": [1.0, 5.0, 100.0],
        "frames_t": [10.0, 50.0, 70.0],
        "frames": [0, 400, 900],
    }
    summary = summarise(s, final_s=30.0, budget_s=60.0)
    assert (
        summary["final_return"] == 5.0 and summary["env_steps_per_s"] == 10.0 and summary["env_steps"] == 400
    )


def test_sample_factory_needs_its_python(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--systems", "sf", "fastlight"])
    assert (
        "--sf-python must name the python of a virtualenv with sample-factory==2.1.1"
        in capsys.readouterr().err
    )


def test_each_mode_runs_the_config_for_its_axis():
    import os

    from benchmarks.mujoco.__main__ import ENV_STEPS_CONFIG, RACE_CONFIG, ROOT

    race = parse_args(["--systems", "fastlight"])
    per_step = parse_args(["--env-steps", "1000"])
    chosen = parse_args(["--env-steps", "1000", "--config", "my.yaml"])
    assert (race.config, per_step.config, chosen.config) == (RACE_CONFIG, ENV_STEPS_CONFIG, "my.yaml")
    assert RACE_CONFIG != ENV_STEPS_CONFIG
    assert all(os.path.isfile(ROOT / c) for c in (RACE_CONFIG, ENV_STEPS_CONFIG))


def test_add_to_keeps_earlier_runs_and_refuses_a_seed_it_has(tmp_path):
    import json

    from benchmarks.mujoco.__main__ import main

    earlier = tmp_path / "mujoco.json"
    runs = [{"system": "fastlight", "env": "Hopper-v4", "seed": s, "final_return": 1.0} for s in (0, 1)]
    earlier.write_text(json.dumps({"command": "python -m benchmarks.mujoco --seeds 0 1", "runs": runs}))
    with pytest.raises(
        SystemExit, match=r"already has runs \[\('Hopper-v4', 'fastlight', 1\)\]; choose other"
    ):
        main(["--env", "Hopper-v4", "--systems", "fastlight", "--seeds", "1", "2", "--add-to", str(earlier)])


def test_env_step_score_averages_the_last_steps_and_skips_nan():
    from benchmarks.mujoco.env_steps import score

    s = {"steps": [2048.0, 4096.0, 6144.0, 8192.0], "t": [1, 2, 3, 4], "ret": [1.0, 10.0, float("nan"), 30.0]}
    assert score(s, final_steps=5000) == {"final_return": 20.0, "env_steps": 8192.0}  # 4096 and 8192
    assert score(s, final_steps=1) == {"final_return": 30.0, "env_steps": 8192.0}


def test_env_step_budget_sets_the_configs_own_callback_or_adds_one(tmp_path):
    from benchmarks.mujoco.env_steps import budget_args

    # The shipped config holds one (with anneal_lr): only its budget changes.
    assert budget_args("configs/mujoco_ppo.yaml", 5000) == ["--trainer.callbacks.total_env_steps", "5000"]
    plain = tmp_path / "plain.yaml"
    plain.write_text("trainer:\n  callbacks:\n    - class_path: fastlight.RolloutThroughput\n")
    assert budget_args(str(plain), 7) == [
        "--trainer.callbacks+=fastlight.EnvStepBudget",
        "--trainer.callbacks.total_env_steps",
        "7",
    ]
    buried = tmp_path / "buried.yaml"
    buried.write_text(
        "trainer:\n  callbacks:\n    - class_path: fastlight.EnvStepBudget\n"
        "    - class_path: fastlight.RolloutThroughput\n"
    )
    with pytest.raises(SystemExit, match="must be the last callback"):
        budget_args(str(buried), 7)


def test_env_step_section_gives_the_verdicts_against_cleanrl():
    from benchmarks.mujoco.env_steps import CLEANRL_1M, CLEANRL_MINUTES, section

    args = parse_args(["--env", "Hopper-v4", "--env-steps", "1000000", "--seeds", "0", "1"])
    assert args.systems == ["fastlight"]  # no Sample Factory python needed in this mode
    ref = CLEANRL_1M["Hopper-v4"][0]
    rows = [
        {
            "env": "Hopper-v4",
            "final_return": ref + d,
            "seconds": 60 * CLEANRL_MINUTES / 5,
            "env_steps_per_s": 3e3,
        }
        for d in (-100.0, 300.0)
    ]
    text = "\n".join(section(rows, args, "cmd"))
    assert f"| Hopper-v4 | 2 | {ref + 100:.0f} ± 200 |" in text
    assert "**met** Hopper-v4: mean return" in text and "(1.04x)" in text
    assert (
        f"**met** Hopper-v4: 1,000,000 steps >= 4x sooner than CleanRL's ~{CLEANRL_MINUTES:.0f} min" in text
    )
    rows[1]["final_return"] = ref - 300
    rows[0]["seconds"] = rows[1]["seconds"] = 60 * CLEANRL_MINUTES / 3
    text = "\n".join(section(rows, args, "cmd"))
    assert "**MISSED** Hopper-v4: mean return" in text and "**MISSED** Hopper-v4: 1,000,000 steps" in text
    assert "bootstrap interval" not in text  # two seeds say nothing of how sure the mean is
    five = [{**rows[0], "final_return": ref + d} for d in (-400.0, -200.0, 0.0, 200.0, 1000.0)]
    text = "\n".join(section(five, args, "cmd"))
    # Subsets of 3 of the 5 offsets with a sum >= 0: the 6 with 1000, and {-200, 0, 200}: 7 of 10.
    assert "CleanRL's 2383 is inside it); 70% of the 3-seed subsets" in text


def test_each_mode_rewrites_only_its_own_section_of_mujoco_md(tmp_path):
    from benchmarks.mujoco.__main__ import RACE, TITLE, write_section

    md = tmp_path / "mujoco.md"
    write_section(md, [RACE, "", "race table 1", "", "### Target", "", "- met"])
    write_section(md, ["## Learning per env step", "", "step table 1"])
    write_section(md, [RACE, "", "race table 2", "", "### Target"])
    text = md.read_text()
    assert text.startswith(TITLE + "\n")
    assert "race table 1" not in text and "- met" not in text and "race table 2" in text
    assert text.index("race table 2") < text.index("step table 1")  # the race keeps its place
    assert text.count("## Learning per env step") == 1


def test_share_of_three_seed_means_counts_every_subset_against_a_naive_loop():
    import numpy as np

    from benchmarks.mujoco.env_steps import share_of_three_seed_means_at_least

    finals = np.array([1000.0, 2000.0, 3000.0, 2500.0, 1500.0])
    naive = 0
    for i in range(5):
        for j in range(i + 1, 5):
            for k in range(j + 1, 5):
                naive += (finals[i] + finals[j] + finals[k]) / 3 >= 2000
    assert share_of_three_seed_means_at_least(finals, 2000.0) == naive / 10
    assert share_of_three_seed_means_at_least(finals, 0.0) == 1.0
    assert share_of_three_seed_means_at_least(finals, 3001.0) == 0.0
    with pytest.raises(ValueError, match=">= 3 seeds"):
        share_of_three_seed_means_at_least(finals[:2], 0.0)


def test_a_run_that_logs_no_return_stops_the_benchmark_naming_why(tmp_path):
    """A failed run (an env id gymnasium refuses, a crash) is never scored as a result, nor timed."""
    import argparse
    import time

    from benchmarks.mujoco import env_steps

    def failed_run(cmd, *, seconds, log, env):
        log.write_text("Traceback ...\nfastlight: error: --data.env_id Pusher-v4 needs mujoco<3\n")
        return time.time()

    args = argparse.Namespace(
        config="configs/mujoco_ppo.yaml", env_steps=1000, fastlight_args=[], final_steps=100,
        eval_every_steps=50_000, eval_episodes=10,
    )  # fmt: skip
    with pytest.raises(
        SystemExit, match=r"Pusher-v4 seed 3 logged no return \(fastlight: error: --data.env_id"
    ):
        env_steps.run("Pusher-v4", 3, args, tmp_path, failed_run)


def _write_events(folder, scalars):
    """TensorBoard events with ``scalars``: tag -> [(logger step, value)], as a run's logger writes them."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for tag, points in scalars.items():
        for step, value in points:
            writer.add_scalar(tag, value, global_step=step)
    writer.close()


def test_evaluations_are_read_at_the_env_steps_of_their_update_and_scored(tmp_path):
    from benchmarks.mujoco.env_steps import eval_scores, read_evals

    # env_steps at every update (logger steps 0-5); an evaluation every 2 updates (after updates 2, 4 and
    # 6: logger steps 1, 3 and 5), and Lightning's stale copies of the latest one at the updates between.
    _write_events(
        tmp_path / "tb" / "version_0",
        {
            "env_steps": [(k, 2048.0 * (k + 1)) for k in range(6)],
            "eval/return": [(1, 120.0), (2, 120.0), (3, 900.0), (4, 900.0), (5, 300.0), (99, 5.0)],
            "rollout/return": [(k, 1.0) for k in range(6)],
        },
    )
    evals = read_evals(tmp_path, every_updates=2)
    assert evals == {"steps": [4096.0, 8192.0, 12288.0], "ret": [120.0, 900.0, 300.0]}
    assert read_evals(tmp_path, every_updates=1)["steps"] == [4096.0, 6144.0, 8192.0, 10240.0, 12288.0]
    # The final evaluation (of last.ckpt, at 14,336 steps) closes the curve; the best is over all of them.
    got = eval_scores(evals, final=700.0, env_steps=14_336.0)
    assert got["final_eval"] == 700.0 and got["best_eval"] == 900.0
    assert got["evals"] == {
        "steps": [4096.0, 8192.0, 12_288.0, 14_336.0],
        "ret": [120.0, 900.0, 300.0, 700.0],
    }
    # An evaluation during training at the final count is the final policy's: the final one replaces it.
    got = eval_scores({"steps": [4096.0, 8192.0], "ret": [120.0, 650.0]}, final=640.0, env_steps=8192.0)
    assert got["evals"]["steps"] == [4096.0, 8192.0] and got["evals"]["ret"] == [120.0, 640.0]
    assert got["best_eval"] == 640.0
    assert eval_scores({"steps": [], "ret": []}, final=3.0, env_steps=1.0)["best_eval"] == 3.0
    assert read_evals(tmp_path / "nothing", every_updates=2) == {"steps": [], "ret": []}


def test_evaluation_is_added_on_the_command_line_every_whole_update_near_the_asked_steps(tmp_path):
    from benchmarks.mujoco.env_steps import EVAL_SEED, eval_args, eval_every_updates, rollout_size

    assert rollout_size("configs/mujoco_ppo.yaml") == 16 * 128  # num_envs, RolloutDataModule's rollout_steps
    assert eval_every_updates("configs/mujoco_ppo.yaml", 50_000) == 24  # 49,152 env steps
    assert eval_args(24, 10) == [
        "--trainer.callbacks+=fastlight.PeriodicEvaluation",
        *("--trainer.callbacks.every_updates", "24", "--trainer.callbacks.episodes", "10"),
        *("--trainer.callbacks.seed", str(EVAL_SEED), "--trainer.callbacks.save_best", "false"),
    ]
    small = tmp_path / "small.yaml"
    small.write_text("data:\n  init_args:\n    num_envs: 4\n    rollout_steps: 1000\n")
    assert eval_every_updates(str(small), 13_000) == 3  # 3.25 updates: the nearest whole
    assert eval_every_updates(str(small), 100) == 1  # never 0


def test_env_step_section_sets_each_metric_beside_its_peer():
    from benchmarks.mujoco.env_steps import CLEANRL_1M, SB3_ZOO_1M, TIANSHOU_1M, section

    args = parse_args(
        ["--env", "Hopper-v4", "InvertedPendulum-v4", "--env-steps", "1000000", "--seeds", "0", "1"]
    )
    row = {"env": "Hopper-v4", "final_return": 2000.0, "seconds": 300.0, "env_steps_per_s": 3e3}
    rows = [
        {**row, "final_eval": 2300.0, "best_eval": 2500.0},
        {**row, "final_eval": 2700.0, "best_eval": 2900.0},
        # a run from before the evaluations (--add-to an older json): no eval columns, counted out of them
        {**row, "env": "InvertedPendulum-v4", "final_return": 1000.0},
    ]
    text = "\n".join(section(rows, args, "cmd"))
    sb3, ts = SB3_ZOO_1M["Hopper-v4"], TIANSHOU_1M["Hopper-v4"]
    assert (
        f"| Hopper-v4 | 2 | 2000 ± 0 | 2000, 2000 | {CLEANRL_1M['Hopper-v4'][0]:.0f} ± 272 | 2500 ± 200 | "
        f"{sb3[0]:.0f} ± {sb3[1]:.0f} | 2700 ± 200 | {ts:.0f} |" in text
    )
    assert "| InvertedPendulum-v4 | 1 | 1000 ± 0 | 1000 | 963 | - | - | - | - |" in text
    assert (
        f"**met** Hopper-v4: mean final deterministic eval >= SB3 zoo's published: 2500 vs {sb3[0]:.0f}"
        in text
    )
    assert (
        f"**met** Hopper-v4: mean best deterministic eval >= Tianshou's published: 2700 vs {ts:.0f}" in text
    )
    rows[1]["best_eval"] = 2600.0  # mean 2550 < 2609
    text = "\n".join(section(rows, args, "cmd"))
    assert (
        f"**MISSED** Hopper-v4: mean best deterministic eval >= Tianshou's published: 2550 vs {ts:.0f}"
        in text
    )
    assert "InvertedPendulum-v4: mean final deterministic eval" not in text  # no peer number, no verdict
