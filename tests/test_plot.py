"""``fastlight plot`` on the CSV / TensorBoard logs of a real run."""

from __future__ import annotations

import csv
import math

import pytest

from fastlight.plot import find_metrics, main, read_columns, series

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_writes_a_png_of_the_runs_curves(highway_run, tmp_path, capsys):
    import imageio.v3 as iio

    out = tmp_path / "curve.png"
    assert main([str(highway_run), "--y", "rollout/return", "loss/entropy", "--out", str(out)]) == out
    assert out.read_bytes()[:8] == PNG_MAGIC
    image = iio.imread(out)
    assert image.shape[0] > 300 and image.shape[1] > 500  # two panels
    assert f"fastlight plot: wrote {out}" in capsys.readouterr().out
    # Default: the run's own folder.
    assert main([str(highway_run)]) == highway_run / "learning_curve.png"
    assert (highway_run / "learning_curve.png").read_bytes()[:8] == PNG_MAGIC


def test_series_follow_the_csv(highway_run):
    metrics = find_metrics(highway_run, None)
    assert metrics == highway_run / "csv" / "version_0" / "metrics.csv"
    columns = read_columns(metrics)
    rows = list(csv.DictReader(metrics.open()))
    # One row per training step (2 rollouts), each with its return.
    xs, ys = series(columns, "step", "rollout/return", metrics)
    assert xs == [0.0, 1.0] and ys == [float(r["rollout/return"]) for r in rows]
    # env_steps: the cumulative valid transitions (EnvStepBudget's column), with every rollout; on
    # one rank the running sum of the rollouts' own valid-step counts.
    xs, ys = series(columns, "env_steps", "rollout/return", metrics)
    valid = [float(r["rollout/valid_steps"]) for r in rows]
    assert xs == [valid[0], valid[0] + valid[1]] and ys == [float(r["rollout/return"]) for r in rows]
    # an older log without that column: the throughput callback's total, from the 2nd rollout on
    older = {k: v for k, v in columns.items() if k != "env_steps"}
    assert series(older, "env_steps", "rollout/return", metrics) == ([sum(valid)], [ys[1]])
    # time: seconds from the TensorBoard log's wall clock, from 0, in step order.
    xs, ys = series(columns, "time", "rollout/return", metrics)
    assert len(xs) == 2 and 0.0 <= xs[0] <= xs[1] < 600 and ys == [float(r["rollout/return"]) for r in rows]


def test_env_steps_needs_the_throughput_column(highway_run, tmp_path, capsys):
    src = find_metrics(highway_run, None)
    rows = list(csv.DictReader(src.open()))
    keep = [k for k in rows[0] if not k.startswith("perf/") and k != "env_steps"]
    folder = tmp_path / "run" / "csv" / "version_3"
    folder.mkdir(parents=True)
    with open(folder / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keep)
        w.writeheader()
        w.writerows({k: r[k] for k in keep} for r in rows)
    assert not math.isnan(read_columns(folder / "metrics.csv")["rollout/return"][0])
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "run"), "--x", "env_steps"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--x env_steps reads env_steps or perf/valid_steps_total" in err[0]
    assert "--x step" in err[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--x", "episodes"], "--x must be one of step | env_steps | time, got 'episodes'"),
        (["--y", "rollout/retrun"], "--y: {metrics} has no column 'rollout/retrun'; it has"),
        (["--version", "7"], "--version must be one of [0]"),
    ],
)
def test_bad_arguments_are_one_line(highway_run, args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(highway_run), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    metrics = highway_run / "csv" / "version_0" / "metrics.csv"
    assert len(err) == 1 and err[0].startswith("fastlight plot: error: "), err
    assert message.format(metrics=metrics) in err[0]


def test_a_folder_without_a_csv_log_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert f"RUN_DIR: no csv/version_*/metrics.csv under {tmp_path}" in capsys.readouterr().err


def test_a_resumed_run_is_drawn_version_after_version(highway_run, tmp_path, capsys):
    """A resume logs into a new csv/version_N: the plot draws every version, in order, one line each;
    a version with no row of the key (a start that failed) is left out; --version reads one alone."""
    import shutil

    from fastlight.plot import run_logs

    root = tmp_path / "run"
    src = find_metrics(highway_run, None)
    rows = list(csv.DictReader(src.open()))
    for version, shift in ((0, 0), (1, 2), (10, 4)):  # version 10 sorts after 1, as a number
        folder = root / "csv" / f"version_{version}"
        folder.mkdir(parents=True)
        with open(folder / "metrics.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            for r in rows:
                w.writerow({**r, "step": str(int(float(r["step"])) + shift)})
    empty = root / "csv" / "version_2"
    empty.mkdir()
    shutil.copy(src, empty / "metrics.csv")
    with open(empty / "metrics.csv", "w", newline="") as f:  # a header and a row without the key
        csv.DictWriter(f, fieldnames=["step", "other"]).writeheader()
        f.write("0,1\n")
    logs = run_logs(root, None)
    assert [m.parent.name for m in logs] == ["version_0", "version_1", "version_2", "version_10"]
    assert run_logs(root, 1) == [root / "csv" / "version_1" / "metrics.csv"]
    out = main([str(root), "--out", str(tmp_path / "joined.png")])
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert "wrote" in capsys.readouterr().out
