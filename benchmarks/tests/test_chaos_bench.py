"""benchmarks.chaos's pure parts: the kill schedule from a seed, the report's arithmetic from a metrics.csv,
the reading of the run's restart lines, and the processes it may kill (below the run only)."""

from __future__ import annotations

import csv
import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest

from benchmarks.chaos import (
    RESTART,
    Kill,
    Run,
    by_kind,
    end_line,
    goodput,
    read_rows,
    schedule,
    summarize,
    workers,
)


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    a = schedule(3, 20.0, 600.0, ["sampler", "inference"])
    assert a == schedule(3, 20.0, 600.0, ["sampler", "inference"])
    assert a != schedule(4, 20.0, 600.0, ["sampler", "inference"])
    times = [t for t, _ in a]
    assert times == sorted(times) and 0 < times[0] and times[-1] < 600.0
    assert {k for _, k in a} == {"sampler", "inference"}


def test_exponential_gaps_have_the_mtbf_as_mean_and_fixed_gaps_are_the_mtbf():
    long = schedule(0, 2.0, 20_000.0, ["sampler"])
    gaps = [b - a for (a, _), (b, _) in zip([(0.0, "")] + long[:-1], long, strict=True)]
    assert len(long) == pytest.approx(10_000, rel=0.05)
    assert sum(gaps) / len(gaps) == pytest.approx(2.0, rel=0.05)
    assert min(gaps) < 0.1 and max(gaps) > 10.0  # spread as an exponential's, not fixed
    fixed = schedule(0, 30.0, 600.0, ["inference"], "fixed")
    assert [t for t, _ in fixed] == [30.0 * i for i in range(1, 20)]
    assert {k for _, k in fixed} == {"inference"}
    with pytest.raises(ValueError, match="--mtbf"):
        schedule(0, 0.0, 60.0, ["sampler"])


def _metrics(path, rows):
    keys = ["step", "perf/valid_steps_total", "faults/worker_restarts", "faults/dropped_rollouts",
            "faults/skipped_updates", "loss"]  # fmt: skip
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def test_the_report_arithmetic_from_a_metrics_csv(tmp_path):
    path = tmp_path / "metrics.csv"
    base_rows = [{"step": i, "perf/valid_steps_total": 100 * (i + 1), "faults/worker_restarts": 0,
                  "faults/dropped_rollouts": 0, "faults/skipped_updates": 0} for i in range(10)]  # fmt: skip
    _metrics(path, base_rows + [{"loss": 0.5}])  # a row without the columns is skipped
    base = summarize(
        Run("baseline", rc=0, wall_s=50.0, row_times=[10.0 + 4 * i for i in range(11)]), read_rows(path)
    )
    assert base["valid_steps"] == 1000 and base["updates"] == 10
    assert base["steps_per_s"] == pytest.approx(20.0)  # 1000 / 50
    assert base["window_s"] == pytest.approx(40.0)
    assert base["window_steps_per_s"] == pytest.approx(900 / 40)  # from the first row's total to the last
    assert base["restarts"] == 0 and base["kills"] == {"sampler": 0, "inference": 0}

    chaos_rows = [
        {"step": i, "perf/valid_steps_total": 80 * (i + 1), "faults/worker_restarts": min(i, 3),
         "faults/dropped_rollouts": 2 * min(i, 3), "faults/skipped_updates": 0}
        for i in range(8)
    ]  # fmt: skip
    _metrics(path, chaos_rows)
    kills = [
        Kill("sampler", 11, 12.0, named="sampler 0", named_pid=11, restart_s=0.3, recovery_s=4.0),
        Kill("inference", 12, 20.0, named="inference worker", named_pid=12, restart_s=0.5, recovery_s=8.0),
        Kill("sampler", 13, 30.0, named="inference worker", named_pid=14, restart_s=0.4, recovery_s=None),
    ]
    run = Run("chaos", rc=0, wall_s=50.0, row_times=[10.0 + 5 * i for i in range(8)], kills=kills)
    chaos = summarize(run, read_rows(path))
    assert chaos["valid_steps"] == 640 and chaos["updates"] == 8
    assert chaos["steps_per_s"] == pytest.approx(12.8)
    assert chaos["window_steps_per_s"] == pytest.approx(560 / 35)
    assert chaos["kills"] == {"sampler": 2, "inference": 1}
    assert chaos["kills_named_as_meant"] == 2 and chaos["unrecovered"] == 1
    assert chaos["recovery_s"] == {"mean": pytest.approx(6.0), "max": pytest.approx(8.0)}
    assert (chaos["restarts"], chaos["dropped_rollouts"], chaos["skipped_updates"]) == (3, 6, 0)
    g = goodput(base, chaos)
    assert g["overall"] == pytest.approx(12.8 / 20.0)
    assert g["window"] == pytest.approx((560 / 35) / (900 / 40))


def test_the_restart_lines_name_the_process_and_pid_and_the_end_line_is_found():
    log = (
        "Traceback (most recent call last):\nEOFError\n"
        "fastlight: sampler 1 (fastlight-sampler-1, pid 4242, env highway-fast-v0) died with exit code -9; "
        "restarting it (1 of 3 restarts in 600 s)\n"
        "fastlight: inference worker (fastlight-inference, pid 4250, env highway-fast-v0) died with exit "
        "code 1; restarting the inference worker and its 2 samplers (2 of 3 ...)\n"
        "fastlight: sampler 0 (fastlight-sampler-0, pid 1, env x) crashed: EnvError: ...; no restart\n"
        "Time limit reached. Elapsed time is 0:03:02. Signaling Trainer to stop.\n"
        "Modules in eval mode: 0\n"
    )
    assert RESTART.findall(log) == [("sampler 1", "4242"), ("inference worker", "4250")]
    assert end_line(log).startswith("Time limit reached")
    assert end_line("a\nb\n") == "b"


def test_the_inference_worker_is_the_groups_last_started_process():
    assert by_kind([5, 7, 9], inference=True) == {"sampler": [5, 7], "inference": [9]}
    assert by_kind([5, 7], inference=False) == {"sampler": [5, 7], "inference": []}
    assert by_kind([], inference=True) == {"sampler": [], "inference": []}


def test_workers_lists_spawned_children_below_the_run_only():
    outside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # not spawn_main
    ctx = mp.get_context("spawn")
    a = ctx.Process(target=time.sleep, args=(30,), daemon=True)
    b = ctx.Process(target=time.sleep, args=(30,), daemon=True)
    try:
        a.start()
        b.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(workers(os.getpid())) < 2:
            time.sleep(0.05)
        found = workers(os.getpid())
        assert set(found) == {a.pid, b.pid}  # not the plain subprocess, nor a resource tracker
        assert found[-1] == b.pid  # oldest first: b was started last
        assert workers(outside.pid) == []
    finally:
        for p in (a, b):
            p.kill()
            p.join(5)
        outside.kill()
        outside.wait(5)
