"""The MT10 report reads a metrics CSV and writes the table and the plot with the right numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks.vla import mt10_report

WEIGHT_A = [0.5 + 0.05 * i for i in range(6)]
WEIGHT_B = [0.5 - 0.05 * i for i in range(6)]
SUCCESS_B = [i / 10 for i in range(6)]


def test_report_numbers_and_plotted_data(tmp_path, monkeypatch):
    rows = []
    for i in range(6):
        rows.append(
            {
                "step": i,
                "dwr/weight_a": WEIGHT_A[i],
                "dwr/weight_b": WEIGHT_B[i],
                "dwr/success_rate_a": 0.0,
                "dwr/success_rate_b": SUCCESS_B[i],
            }
        )
        rows.append({"step": i, "loss/total": 1.0})  # other metrics land on separate CSV rows
    csv = tmp_path / "metrics.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    figures = []
    plot = mt10_report.plot
    monkeypatch.setattr(mt10_report, "plot", lambda *a, **kw: figures.append(plot(*a, **kw)))
    mt10_report.main(["--metrics", str(csv), "--out", str(tmp_path), "--edge", "2"])
    md = (tmp_path / "mt10.md").read_text()
    assert "| a | 0.00 | 0.00 | 0.500 | 0.750 |" in md
    assert "| b | 0.05 | 0.45 | 0.500 | 0.250 |" in md  # mean of 0.0, 0.1 and of 0.4, 0.5
    assert "6 updates." in md

    assert (tmp_path / "mt10_dwr_weights.png").is_file()
    (fig,) = figures
    weights, success = fig.axes
    assert weights.get_ylabel() == "DWR sampling weight"
    assert success.get_ylabel() == "success rate (DWR window)" and success.get_xlabel() == "update"
    # One line per task in each panel, against the update index (the loss-only rows are dropped).
    for ax, series in (
        (weights, {"a": WEIGHT_A, "b": WEIGHT_B}),
        (success, {"a": [0.0] * 6, "b": SUCCESS_B}),
    ):
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == ["a", "b"]
        for line, name in zip(lines, ["a", "b"], strict=True):
            np.testing.assert_array_equal(line.get_xdata(), np.arange(6))
            np.testing.assert_allclose(line.get_ydata(), series[name], rtol=0, atol=1e-12)
    assert [t.get_text() for t in weights.get_legend().get_texts()] == ["a", "b"]


def test_tasks_without_success_column_get_a_weight_line_only(tmp_path):
    df = pd.DataFrame(
        {"dwr/weight_a": [0.2, 0.4, 0.6], "dwr/weight_b": [0.8, 0.6, 0.4], "dwr/success_rate_b": 0.5}
    )
    fig = mt10_report.plot(df, mt10_report.tasks(df), str(tmp_path / "p.png"))
    weights, success = fig.axes
    assert [line.get_label() for line in weights.get_lines()] == ["a", "b"]
    np.testing.assert_allclose(weights.get_lines()[0].get_ydata(), [0.2, 0.4, 0.6])
    assert [line.get_label() for line in success.get_lines()] == ["b"]
    np.testing.assert_allclose(success.get_lines()[0].get_ydata(), [0.5, 0.5, 0.5])
    assert (tmp_path / "p.png").is_file()
