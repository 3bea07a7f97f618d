"""``fastlight plot``: the learning curve of a run, from its CSV log.

    fastlight plot runs/highway_dpsa
    fastlight plot runs/highway_dpsa --x env_steps --y rollout/return rollout/crash_rate --out curve.png

Reads ``RUN_DIR/csv/version_N/metrics.csv`` (every version, in order, one line each, so a resumed
run's curve goes on where it stopped; ``--version N`` reads one; a version folder or a ``metrics.csv``
also works) and draws one panel per ``--y`` key against ``--x``:

- ``step``: Lightning's logging step, one per training step (= one Rollout, one policy update);
- ``env_steps``: the env transitions learned from so far (DPSA's padding excluded), or
  ``perf/valid_steps_total`` in a log without ``env_steps``;
- ``time``: seconds since the first logged value, from the run's TensorBoard log of the same version.

Needs matplotlib (the ``bench`` extra). Writes ``--out`` (default ``RUN_DIR/learning_curve.png``).
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
    p.add_argument("--version", type=int, help="csv/version_N to read alone (default: every version)")
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


def run_logs(run_dir: Path, version: int | None) -> list[Path]:
    """Every ``metrics.csv`` of a run root, by version (a resumed run logs into a new one); the one
    :func:`find_metrics` picks where ``version`` is given or ``run_dir`` is a version or a file."""
    newest = find_metrics(run_dir, version)
    if version is not None or newest.parent.parent != run_dir / "csv":
        return [newest]
    logs = [d / "metrics.csv" for d in (run_dir / "csv").glob("version_*") if (d / "metrics.csv").is_file()]
    return sorted(logs, key=lambda m: int(m.parent.name.removeprefix("version_")))


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
        if not (found := [c for c in ENV_STEPS if c in columns]):
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

    logs = run_logs(Path(run_dir), version)
    labels = {"step": "training step (rollout)", "env_steps": "env steps (valid transitions)"}
    fig, axes = plt.subplots(len(ys), 1, figsize=(7, 2.6 * len(ys)), sharex=True, squeeze=False)
    for ax, y in zip(axes[:, 0], ys, strict=True):
        offset, drawn = 0.0, 0  # --x time: a later version's clock starts where the one before it ended
        for metrics in logs:
            try:
                xs, vs = series(read_columns(metrics), x, y, metrics)
            except ValueError:
                if len(logs) == 1 or (metrics is logs[-1] and not drawn):
                    raise
                continue  # a version that stopped before it logged ``y`` (a failed start, a resume)
            drawn += 1
            xs = [v + offset for v in xs] if x == "time" else xs
            offset = xs[-1] if x == "time" else offset
            label = metrics.parent.name if len(logs) > 1 else None
            ax.plot(xs, vs, marker="." if len(xs) < 50 else None, label=label)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
        if len(logs) > 1:
            ax.legend(fontsize="small")
    axes[-1, 0].set_xlabel(labels.get(x, "seconds"))
    axes[0, 0].set_title(str(logs[-1] if len(logs) == 1 else Path(run_dir)))
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
