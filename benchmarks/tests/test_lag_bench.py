"""benchmarks.sync.lag: reading a run's updates from its metrics.csv."""

from __future__ import annotations

import pytest

from benchmarks.sync.lag import markdown, read_updates, summarise


def test_updates_are_the_rows_with_a_policy_lag_and_the_lag_is_weighted_by_valid_steps(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text(
        "step,rollout/policy_lag,rollout/valid_steps,perf/effective_tps,rollout/cut_in_flight,train/loss\n"
        "0,0.5,100,20,1,\n"
        "1,,,,,0.3\n"  # an optimizer-step row: not an update
        "15,0.0,300,30,0,\n"
    )
    updates = read_updates(path)
    assert len(updates) == 2
    s = summarise(updates)
    assert s["updates"] == 2 and s["valid_steps"] == 400
    assert s["lag_mean"] == pytest.approx(0.25)
    assert s["lag_step_weighted"] == pytest.approx(0.5 * 100 / 400)
    assert s["effective_tps_mean"] == pytest.approx(25.0)
    assert s["cut_in_flight_mean"] == pytest.approx(0.5)
    variant = {"runs": [s], "lag_mean": 0.25, "valid_steps": 400, "effective_tps_mean": 25.0}
    summary = {"command": "c", "loadavg_start": 1.0, "loadavg_end": 2.0, "variants": {"cut": variant}}
    assert "| cut | 1 | 2 | 0.250 | 0.125 | 400 | 25.0 | 0.50 |" in markdown(summary)


def test_a_run_without_updates_is_an_error():
    with pytest.raises(ValueError, match="no update"):
        summarise([])
