"""Report of a Meta-World MT10 run: per-task success early vs late, and DWR weights over time.

    python -m benchmarks.vla.mt10_report --metrics runs/vla_metaworld_mt10/csv/version_0/metrics.csv

Reads the run's CSV log (``dwr/success_rate_<task>`` over DWR's sliding window and
``dwr/weight_<task>``, logged every update), writes ``mt10.md`` (the table, the command) and
``mt10_dwr_weights.png`` (weights and windowed success per task against the update index).
"""

from __future__ import annotations

import argparse
import os

from fastlight.extras import check_extra

check_extra("matplotlib", "pandas", extra="bench", what="python -m benchmarks.vla.mt10_report")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def load(path: str) -> pd.DataFrame:
    df = pd.read_csv(path)
    cols = [c for c in df.columns if c.startswith("dwr/")]
    if not cols:
        raise ValueError(f"{path} has no dwr/* columns: was DynamicWeightedResampling attached?")
    return df.dropna(subset=[c for c in cols if c.startswith("dwr/weight_")]).reset_index(drop=True)


def tasks(df: pd.DataFrame) -> list[str]:
    return [c.removeprefix("dwr/weight_") for c in df.columns if c.startswith("dwr/weight_")]


def window_rates(df: pd.DataFrame, names: list[str], rows: slice) -> dict[str, float]:
    part = df.iloc[rows]
    out = {}
    for n in names:
        col = part.get(f"dwr/success_rate_{n}")
        out[n] = float(col.dropna().mean()) if col is not None and col.notna().any() else float("nan")
    return out


def plot(df: pd.DataFrame, names: list[str], path: str) -> Figure:
    """Save the weights (top) and windowed success (bottom) per task; returns the (closed) Figure."""
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    x = range(len(df))
    for n in names:
        a.plot(x, df[f"dwr/weight_{n}"], label=n)
        if f"dwr/success_rate_{n}" in df:
            b.plot(x, df[f"dwr/success_rate_{n}"], label=n)
    a.set_ylabel("DWR sampling weight")
    b.set_ylabel("success rate (DWR window)")
    b.set_xlabel("update")
    a.legend(fontsize=7, ncol=2)
    a.set_title("Meta-World MT10: Dynamic Weighted Resampling")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metrics", required=True)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--edge", type=int, default=10, help="updates averaged for 'early' and 'late'")
    p.add_argument("--run-command", default="fastlight fit --config configs/vla_metaworld_mt10.yaml")
    args = p.parse_args(argv)
    df = load(args.metrics)
    names = tasks(df)
    k = min(args.edge, max(1, len(df) // 2))
    early, late = window_rates(df, names, slice(0, k)), window_rates(df, names, slice(len(df) - k, len(df)))
    w0, w1 = df.iloc[0], df.iloc[-1]
    os.makedirs(args.out, exist_ok=True)
    plot(df, names, os.path.join(args.out, "mt10_dwr_weights.png"))
    first = {n: w0[f"dwr/weight_{n}"] for n in names}
    last = {n: w1[f"dwr/weight_{n}"] for n in names}
    rows = [f"| {n} | {early[n]:.2f} | {late[n]:.2f} | {first[n]:.3f} | {last[n]:.3f} |" for n in names]
    text = "\n".join(
        [
            "# Meta-World MT10: tiny VLA + GIPO + DPSA + DWR on CPU",
            "",
            f"{len(df)} updates. Success is DWR's windowed success rate per task (last `window` outcomes,",
            f"pooled over samplers), averaged over the first and the last {k} updates.",
            "",
            "| task | success (early) | success (late) | DWR weight (first) | DWR weight (last) |",
            "|---|---|---|---|---|",
            *rows,
            "",
            "![DWR weights](mt10_dwr_weights.png)",
            "",
            "Commands:",
            "",
            "```bash",
            args.run_command,
            f"python -m benchmarks.vla.mt10_report --metrics {args.metrics} --edge {args.edge}",
            "```",
            "",
        ]
    )
    with open(os.path.join(args.out, "mt10.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
