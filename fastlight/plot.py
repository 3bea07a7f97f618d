"""``fastlight plot``: the learning curve of a run, from its CSV log.

    fastlight plot runs/highway_dpsa
    fastlight plot runs/highway_dpsa --x env_steps --y rollout/return rollout/crash_rate --out curve.png

Reads ``RUN_DIR/csv/version_N/metrics.csv`` (the CSVLogger ``fastlight fit`` attaches; the newest
version unless ``--version N``; a version folder or a ``metrics.csv`` itself also works) and draws
one panel per ``--y`` key (default ``rollout/return``) against ``--x``:

- ``step``: Lightning's logging step, one per training step (= one Rollout, one policy update);
- ``env_steps``: the ``env_steps`` column, the env transitions learned from so far (DPSA's padding
  excluded), logged with every Rollout by ``EnvStepBudget``, which ``fastlight fit`` attaches to
  every run; a log without it (an older run, a plain Lightning project) falls back to
  ``perf/valid_steps_total`` (the ``RolloutThroughput`` callback's, from the second Rollout on);
- ``time``: seconds since the first logged value, from the wall times of the run's TensorBoard
  log of the same version (``RUN_DIR/tb/version_N``): a CSV row holds no clock.

Rows without the ``--y`` value (other loggers' rows) are skipped. Needs matplotlib (the ``bench``
extra). Writes ``--out`` (default ``RUN_DIR/learning_curve.png``).
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from pathlib import Path
from typing import NoReturn

from fastlight.cli_output import OneLineArgumentParser
from fastlight.cli_output import fail as cli_fail

PROG = "fastlight plot"
X_CHOICES = ("step", "env_steps", "time")
#: Columns that ``--x env_steps`` reads, the first one present.
ENV_STEPS = ("env_steps", "perf/valid_steps_total")


def fail(message: str) -> NoReturn:
    cli_fail(message, prog=PROG)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run's --trainer.default_root_dir")
    p.add_argument("--x", default="step", help=f"x axis: {' | '.join(X_CHOICES)} (default step)")
    p.add_argument("--y", nargs="+", default=["rollout/return"], metavar="KEY", help="logged keys")
    p.add_argument("--version", type=int, help="csv/version_N to read (default: the newest)")
    p.add_argument("--out", metavar="PNG", help="image to write (default: RUN_DIR/learning_curve.png)")
    return p


def find_metrics(run_dir: Path, version: int | None) -> Path:
    """The ``metrics.csv`` of ``run_dir`` (a run root, a ``version_N`` folder or the file itself)."""
    if run_dir.is_file():
        return run_dir
    if (run_dir / "metrics.csv").is_file():
        return run_dir / "metrics.csv"
    versions = {
        int(m.group(1)): d
        for d in (run_dir / "csv").glob("version_*")
        if (m := re.fullmatch(r"version_(\d+)", d.name)) and (d / "metrics.csv").is_file()
    }
    if not versions:
        raise ValueError(
            f"RUN_DIR: no csv/version_*/metrics.csv under {run_dir} (the CSV log of fastlight fit)"
        )
    if version is None:
        return versions[max(versions)] / "metrics.csv"
    if version not in versions:
        raise ValueError(
            f"--version must be one of {sorted(versions)} (under {run_dir / 'csv'}), got {version}"
        )
    return versions[version] / "metrics.csv"


def read_columns(path: Path) -> dict[str, list[float]]:
    """Column -> values (``nan`` where a row leaves it empty)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"RUN_DIR: {path} has no rows yet")
    return {k: [float(r[k]) if r.get(k) not in (None, "") else math.nan for r in rows] for k in rows[0]}


def wall_times(metrics: Path, tag: str) -> dict[int, float]:
    """step -> seconds since the run's first logged value, from the TensorBoard log of the same version."""
    version_dir = metrics.parent
    tb = version_dir.parent.parent / "tb" / version_dir.name
    if not tb.is_dir():
        raise ValueError(f"--x time reads wall-clock times from the run's TensorBoard log; no {tb}")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    if tag not in tags:
        raise ValueError(f"--x time: {tb} has no {tag!r} scalars")
    t0 = min(e.wall_time for t in tags for e in acc.Scalars(t))
    return {int(e.step): e.wall_time - t0 for e in acc.Scalars(tag)}


def series(columns: dict[str, list[float]], x: str, y: str, metrics: Path) -> tuple[list[float], list[float]]:
    """``(xs, ys)`` of the rows where both are logged."""
    if y not in columns:
        shown = ", ".join(sorted(k for k in columns if "/" in k))
        raise ValueError(f"--y: {metrics} has no column {y!r}; it has {shown}")
    steps = columns["step"]
    if x == "step":
        xs = steps
    elif x == "env_steps":
        found = [c for c in ENV_STEPS if c in columns]
        if not found:
            raise ValueError(
                f"--x env_steps reads {' or '.join(ENV_STEPS)}, which {metrics} lacks (logged by the "
                "EnvStepBudget and RolloutThroughput callbacks); use --x step"
            )
        xs = columns[found[0]]
    else:
        clock = wall_times(metrics, y)
        xs = [clock.get(int(s), math.nan) if not math.isnan(s) else math.nan for s in steps]
    pairs = [(a, b) for a, b in zip(xs, columns[y], strict=True) if not (math.isnan(a) or math.isnan(b))]
    if not pairs:
        raise ValueError(f"--y: no row of {metrics} has both {y!r} and the --x {x} value")
    return [a for a, _ in pairs], [b for _, b in pairs]


def plot(
    run_dir: str, *, x: str = "step", ys: list[str], version: int | None = None, out: str | None = None
) -> Path:
    """Draw the curves and write the PNG; returns its path. ``ValueError`` names the bad argument."""
    if x not in X_CHOICES:
        raise ValueError(f"--x must be one of {' | '.join(X_CHOICES)}, got {x!r}")
    from fastlight.extras import check_extra

    check_extra("matplotlib", extra="bench", what=PROG)
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    metrics = find_metrics(Path(run_dir), version)
    columns = read_columns(metrics)
    data = [(y, *series(columns, x, y, metrics)) for y in ys]
    labels = {"step": "training step (rollout)", "env_steps": "env steps (valid transitions)"}
    fig, axes = plt.subplots(len(data), 1, figsize=(7, 2.6 * len(data)), sharex=True, squeeze=False)
    for ax, (y, xs, vs) in zip(axes[:, 0], data, strict=True):
        ax.plot(xs, vs, marker="." if len(xs) < 50 else None)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel(labels.get(x, "seconds"))
    axes[0, 0].set_title(str(metrics))
    fig.tight_layout()
    folder = Path(run_dir) if Path(run_dir).is_dir() else Path(run_dir).parent
    path = Path(out) if out else folder / "learning_curve.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(list(sys.argv[2:] if argv is None else argv))
    try:
        path = plot(args.run_dir, x=args.x, ys=args.y, version=args.version, out=args.out)
    except (ValueError, ModuleNotFoundError) as e:
        fail(str(e))
    print(f"{PROG}: wrote {path}")
    return path
