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
