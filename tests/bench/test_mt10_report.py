"""The MT10 report reads a metrics CSV and writes the table and the plot with the right numbers."""

from __future__ import annotations

import pandas as pd

from fastlight.bench.mt10_report import main


def test_report_numbers(tmp_path):
    rows = []
    for i in range(6):
        rows.append(
            {
                "step": i,
                "dwr/weight_a": 0.5 + 0.05 * i,
                "dwr/weight_b": 0.5 - 0.05 * i,
                "dwr/success_rate_a": 0.0,
                "dwr/success_rate_b": i / 10,
            }
        )
        rows.append({"step": i, "loss/total": 1.0})  # other metrics land on separate CSV rows
    csv = tmp_path / "metrics.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    main(["--metrics", str(csv), "--out", str(tmp_path), "--edge", "2"])
    md = (tmp_path / "mt10.md").read_text()
    assert "| a | 0.00 | 0.00 | 0.500 | 0.750 |" in md
    assert "| b | 0.05 | 0.45 | 0.500 | 0.250 |" in md  # mean of 0.0, 0.1 and of 0.4, 0.5
    assert (tmp_path / "mt10_dwr_weights.png").stat().st_size > 10_000
