"""Start-up to first rollout, and sampler memory, of a real ``fastlight fit`` run.

    python -m benchmarks.startup --config configs/highway_dpsa.yaml --runs 3
    python -m benchmarks.startup --command "python -m fastlight" ...
    python -m benchmarks.startup --start-methods spawn forkserver   # A/B, interleaved

Each run launches the command as a fresh process with :class:`FirstRolloutClock` attached
(``--trainer.callbacks+=``). The clock is read against the wall time the runner took right
before it started the process (``FASTLIGHT_T0``), so the figure covers the interpreter start,
every import, the config parse, the env probe, the sampler spawn and the first sampling rounds:
it is the time until the first Rollout is in the trainer (``on_train_batch_start`` of batch 0).
The callback also reads every sampler process's ``VmRSS`` / ``RssAnon`` from ``/proc`` once
``rss_after`` Rollouts have arrived (steady state: envs built, policy run), then stops the run.
With a forkserver (``--data.start_method``, :mod:`fastlight.fleet.start`) it also reads the
forkserver's CPU seconds (its preload imports, which a forked sampler does not repeat).
With several ``--start-methods`` the launches alternate between them, so both see the same
machine state.

Machines differ in how fast they import, so the figure that carries over is a ratio: before each
launch the runner also times a bare ``python -c "import lightning"`` (the same interpreter, a fresh
process, wall time), and the summary reports the first rollout's median over that median
(``first_rollout_over_import_lightning``; issue target <= 1.2).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from benchmarks.procfs import cpu_seconds, memory_mb
from fastlight.data.datamodule import RolloutDataModule
from fastlight.procs import parent_pid

_T0 = "FASTLIGHT_T0"
_OUT = "FASTLIGHT_STARTUP_OUT"


class FirstRolloutClock(Callback):
    """Writes (JSON, to ``$FASTLIGHT_STARTUP_OUT``) the seconds from ``$FASTLIGHT_T0`` to the first
    Rollout batch, and the samplers' memory after ``rss_after`` batches; then stops the run.

    No state to checkpoint: it measures one launch.
    """

    def __init__(self, rss_after: int = 3) -> None:
        super().__init__()
        if rss_after < 1:
            raise ValueError(f"FirstRolloutClock rss_after must be >= 1, got {rss_after}")
        self.rss_after = rss_after
        self.result: dict[str, Any] = {}

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if "first_rollout_s" not in self.result:
            self.result["first_rollout_s"] = time.time() - float(os.environ.get(_T0, time.time()))
            # CPU seconds spent so far by each process: on a shared machine the wall time above
            # grows with the load, these much less.
            self.result["trainer_cpu_s"] = cpu_seconds(os.getpid())
            self.result["sampler_cpu_s"] = [cpu_seconds(pid) for pid in _sampler_pids(trainer)]
            servers = {parent_pid(pid) for pid in _sampler_pids(trainer)} - {os.getpid()}
            self.result["forkserver_cpu_s"] = sum(cpu_seconds(pid) for pid in servers if pid)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx + 1 < self.rss_after:
            return
        self.result["samplers"] = [memory_mb(pid) for pid in _sampler_pids(trainer)]
        self.result["trainer"] = memory_mb(os.getpid())
        out = os.environ.get(_OUT)
        if out:
            with open(out, "w") as f:
                json.dump(self.result, f)
        trainer.should_stop = True


def _sampler_pids(trainer: pl.Trainer) -> list[int]:
    dm = trainer.datamodule
    return [p.pid for p in dm.pool.procs] if isinstance(dm, RolloutDataModule) and dm.pool else []


def run_once(
    command: list[str],
    config: str,
    root: str,
    start_method: str | None = None,
) -> dict[str, Any]:
    """One launch of ``command fit --config config`` with the clock attached; its result."""
    out = os.path.join(root, "startup.json")
    args = [
        *command,
        "fit",
        "--config",
        config,
        f"--trainer.default_root_dir={root}",
        "--trainer.callbacks+=benchmarks.startup.FirstRolloutClock",
        "--trainer.enable_progress_bar=false",
    ]
    if start_method is not None:
        args.append(f"--data.start_method={start_method}")
    env = dict(os.environ, **{_OUT: out, _T0: repr(time.time())})
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"{shlex.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(out) as f:
        return json.load(f)


def import_lightning_s(python: str) -> float:
    """Wall seconds of a fresh ``python -c "import lightning"`` (the interpreter start included)."""
    t0 = time.perf_counter()
    subprocess.run([python, "-c", "import lightning"], check=True, timeout=300)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="configs/highway_dpsa.yaml")
    parser.add_argument("--command", default="fastlight", help="how to launch fastlight (shell words)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--start-methods",
        nargs="+",
        choices=["spawn", "forkserver"],
        help="launch with each --data.start_method in turn (default: the command's own choice)",
    )
    a = parser.parse_args(argv)
    if a.runs < 1:
        parser.error(f"--runs must be >= 1, got {a.runs}")
    variants = a.start_methods or [None]
    results: dict[str, list[dict[str, Any]]] = {_name(m): [] for m in variants}
    imports: list[float] = []
    for _ in range(a.runs):
        for method in variants:
            imports.append(import_lightning_s(sys.executable))
            print(f"[import lightning] {imports[-1]:.2f} s, load {os.getloadavg()[0]:.1f}", flush=True)
            with tempfile.TemporaryDirectory() as root:
                r = run_once(shlex.split(a.command), a.config, root, method)
            results[_name(method)].append(r)
            rss = [round(s["VmRSS"]) for s in r["samplers"]]
            cpu = [round(c, 1) for c in r["sampler_cpu_s"]]
            print(
                f"[{_name(method)}] first rollout {r['first_rollout_s']:.2f} s (CPU: trainer "
                f"{r['trainer_cpu_s']:.1f} s, samplers {cpu} s, forkserver {r['forkserver_cpu_s']:.1f} s), "
                f"sampler VmRSS {rss} MB, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    summary: dict[str, Any] = {"command": a.command, "config": a.config, "loadavg_1min": os.getloadavg()[0]}
    summary["import_lightning_s_median"] = statistics.median(imports)
    summary["import_lightning_s"] = imports
    for method, runs in results.items():
        s = _summary(runs)
        s["first_rollout_over_import_lightning"] = s["first_rollout_s_median"] / statistics.median(imports)
        summary[method] = s
    print(json.dumps(summary, indent=1))


def _name(method: str | None) -> str:
    return method or "default"


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    firsts = [r["first_rollout_s"] for r in results]
    samplers = [s for r in results for s in r["samplers"]]
    return {
        "first_rollout_s_median": statistics.median(firsts),
        "first_rollout_s": firsts,
        "trainer_cpu_s_median": statistics.median(r["trainer_cpu_s"] for r in results),
        "sampler_cpu_s_median": statistics.median(c for r in results for c in r["sampler_cpu_s"]),
        "forkserver_cpu_s_median": statistics.median(r["forkserver_cpu_s"] for r in results),
        "sampler_vmrss_mb_max": max(s["VmRSS"] for s in samplers),
        "sampler_rssanon_mb_max": max(s["RssAnon"] for s in samplers),
        "sampler_pss_mb_max": max((s.get("Pss", math.nan) for s in samplers), default=math.nan),
        "trainer_vmrss_mb_max": max(r["trainer"]["VmRSS"] for r in results),
    }


if __name__ == "__main__":
    sys.exit(main())
