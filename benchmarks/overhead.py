"""Trainer overhead: the main job's training throughput against the env's raw stepping rate.

    python -m benchmarks.overhead --config configs/highway_dpsa.yaml --pairs 3
    python -m benchmarks.overhead --out benchmarks/results/overhead.json --pairs 3 --batches 24
    python -m benchmarks.overhead --variants 'apart=--data.rank_rounds=apart' 'together='

The raw ceiling is what the machine can do with the env alone: ``num_workers`` processes (the
run's sampler count), each stepping its share of the run's ``num_envs`` envs (split as the
DataModule splits them) one after the other with random actions (autoreset), nothing else. The
training figure is a real ``fastlight fit --config <config>`` launch with :class:`TrainClock`
attached: valid env steps the learner consumed per second between its ``--warmup``-th and last
Rollout batch (start-up and the first rounds left out), updates, weight publishes, pipes and
collation all inside. Blocks alternate (raw, fit, raw, fit, ...), the raw workers idle on a pipe
while a fit runs, so both see the same machine; the ratio is the fits' summed steps over their
summed seconds, over the same for the raw blocks (issue target >= 95 %). With ``--variants``,
each pair runs one fit per variant after its raw block, in an order that alternates between
pairs, so settings (or, with ``NAME@DIR``, code versions) are compared against the same ceiling.

Where the time goes: :class:`TrainClock` also splits the trainer's wall clock over the window
into the training step (``on_train_batch_start`` to ``_end``: the update) and the rest (waiting
for the next Rollout, collation, callbacks), reads each process's CPU seconds from ``/proc`` at
both ends of the window, and sums the samplers' own counters (``step_time``: inside
``env.step``; ``reset_time``; ``wall_time``: the whole cycle, policy forward included), so one
launch says how much of each sampler's time is the env, the policy and the rest, and how much of
their cores the samplers computed on at all (``busy share``: the rest they waited).
"""

from __future__ import annotations

import argparse
import inspect
import json
import multiprocessing as mp
import os
import shlex
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from benchmarks.procfs import cpu_seconds
from fastlight.data.datamodule import RolloutDataModule
from fastlight.rollout import Rollout

#: The issue's target: training throughput over the raw ceiling.
TARGET_RATIO = 0.95
_OUT = "FASTLIGHT_OVERHEAD_OUT"


class TrainClock(Callback):
    """Writes (JSON, to ``$FASTLIGHT_OVERHEAD_OUT``) the steady-state throughput of a run and where
    its trainer's and samplers' time went, between Rollout batch ``warmup`` and ``batches``; then
    stops the run. No state to checkpoint: it measures one launch.
    """

    def __init__(self, batches: int = 24, warmup: int = 4) -> None:
        super().__init__()
        if warmup < 1 or batches <= warmup:
            raise ValueError(
                f"TrainClock needs 1 <= warmup < batches, got warmup={warmup}, batches={batches}"
            )
        self.batches = batches
        self.warmup = warmup
        self._t0 = 0.0
        self._start = 0.0
        self._cpu0: dict[str, float] = {}
        self.update_s = 0.0
        self._seen = 0  # Rollout batches so far (batch_idx restarts every epoch)
        self.counts = {
            "valid_steps": 0,
            "raw_steps": 0,
            "step_time": 0.0,
            "reset_time": 0.0,
            "wall_time": 0.0,
        }

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._start = time.perf_counter()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        self._seen += 1
        n = self._seen
        if n == self.warmup:  # the window opens after this batch: its steps came before the clock
            self._t0 = now
            self._cpu0 = _cpu(trainer)
            return
        if n < self.warmup:
            return
        self.update_s += now - self._start
        if isinstance(batch, Rollout):
            s = batch.stats
            self.counts["valid_steps"] += s.valid_steps
            self.counts["raw_steps"] += s.raw_steps
            self.counts["step_time"] += s.step_time
            self.counts["reset_time"] += s.reset_time
            self.counts["wall_time"] += s.wall_time
        if n < self.batches:
            return
        elapsed = now - self._t0
        cpu1 = _cpu(trainer)
        result = {
            "batches": n - self.warmup,
            "elapsed_s": elapsed,
            "valid_tps": self.counts["valid_steps"] / elapsed,
            "update_s": self.update_s,
            "cpu_s": {k: cpu1[k] - self._cpu0.get(k, 0.0) for k in cpu1},
            **self.counts,
        }
        out = os.environ.get(_OUT)
        if out:
            with open(out, "w") as f:
                json.dump(result, f)
        trainer.should_stop = True


def _cpu(trainer: pl.Trainer) -> dict[str, float]:
    dm = trainer.datamodule
    pids = [p.pid for p in dm.pool.procs] if isinstance(dm, RolloutDataModule) and dm.pool else []
    out = {"trainer": cpu_seconds(os.getpid())}
    for i, pid in enumerate(pids):
        out[f"sampler{i}"] = cpu_seconds(pid)
    return out


def raw_worker(conn: Connection, env_id: str, env_kwargs: dict[str, Any], num_envs: int, seed: int) -> None:
    """Steps ``num_envs`` envs with random actions for as long as each request says; answers the
    env steps taken, the wall and CPU seconds used and the seconds inside ``env.reset``. Idles on
    the pipe between requests."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fastlight.envs.registry import make_env

    envs = [make_env(env_id, env_kwargs=env_kwargs) for _ in range(num_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=seed + i)
        env.action_space.seed(seed + i)
    conn.send("ready")
    while True:
        seconds = conn.recv()
        if seconds is None:
            break
        steps = 0
        reset_s = 0.0
        c0 = time.process_time()
        deadline = time.perf_counter() + seconds
        t0 = time.perf_counter()
        while time.perf_counter() < deadline:
            for env in envs:
                _, _, terminated, truncated, _ = env.step(env.action_space.sample())
                steps += 1
                if terminated or truncated:
                    r0 = time.perf_counter()
                    env.reset()
                    reset_s += time.perf_counter() - r0
        conn.send((steps, time.perf_counter() - t0, time.process_time() - c0, reset_s))
    for env in envs:
        env.close()


class RawCeiling:
    """``workers`` processes stepping the env alone, started once, driven block by block;
    ``num_envs`` in all, split over them."""

    def __init__(self, *, env_id: str, env_kwargs: dict[str, Any], workers: int, num_envs: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs = []
        base, extra = divmod(num_envs, workers)  # as RolloutDataModule.sampler_configs splits them
        for i in range(workers):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=raw_worker, args=(child, env_id, env_kwargs, base + (i < extra), 1000 * i), daemon=True
            )
            p.start()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:
            if not c.poll(300):
                raise RuntimeError("a raw-ceiling worker did not start within 300 s")
            c.recv()

    def block(self, seconds: float) -> dict[str, float]:
        for c in self.conns:
            c.send(seconds)
        answers = [c.recv() for c in self.conns]
        steps = sum(a[0] for a in answers)
        wall = max(a[1] for a in answers)
        return {
            "steps": steps,
            "elapsed_s": wall,
            "tps": steps / wall,
            "cpu_s": sum(a[2] for a in answers),
            "reset_s": sum(a[3] for a in answers),
        }

    def close(self) -> None:
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def run_fit(
    command: list[str],
    config: str,
    root: str,
    *,
    batches: int,
    warmup: int,
    extra: list[str],
    cwd: str | None = None,
) -> dict:
    out = os.path.join(root, "overhead.json")
    args = [
        *command,
        "fit",
        "--config",
        config,
        f"--trainer.default_root_dir={root}",
        "--trainer.callbacks+=benchmarks.overhead.TrainClock",
        f"--trainer.callbacks.batches={batches}",
        f"--trainer.callbacks.warmup={warmup}",
        "--trainer.enable_progress_bar=false",
        "--trainer.max_time=null",
        "--trainer.max_steps=-1",
        *extra,
    ]
    proc = subprocess.run(
        args, env=dict(os.environ, **{_OUT: out}), capture_output=True, text=True, timeout=900, cwd=cwd
    )
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"{shlex.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(out) as f:
        return json.load(f)


def data_settings(config: str, extra: list[str]) -> dict[str, Any]:
    """The env id, env kwargs, sampler and env counts the fit will use: the config's ``data``
    init args, then ``--data.<name>=<value>`` overrides, then ``RolloutDataModule``'s defaults."""
    import yaml

    with open(config) as f:
        data = dict(((yaml.safe_load(f) or {}).get("data") or {}).get("init_args") or {})
    for arg in extra:
        key, sep, value = arg.removeprefix("--data.").partition("=")
        if arg.startswith("--data.") and sep:
            data[key] = yaml.safe_load(value)
    defaults = {k: p.default for k, p in inspect.signature(RolloutDataModule.__init__).parameters.items()}
    get = lambda k: data.get(k, defaults.get(k))  # noqa: E731
    return {
        "env_id": get("env_id"),
        "env_kwargs": get("env_kwargs") or {},
        "workers": int(get("num_workers")),
        "num_envs": int(get("num_envs")),
    }


def markdown(summary: dict[str, Any]) -> str:
    names = list(summary["variants"])
    lines = [
        f"Command: `{summary['command']}` (1-minute load {summary['loadavg_start']:.1f} at the start, "
        f"{summary['loadavg_end']:.1f} at the end)",
        "",
        "| pair | raw ceiling env-steps/s | "
        + " | ".join(f"{n}: valid env-steps/s (ratio)" for n in names)
        + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for i, raw in enumerate(summary["raw"]):
        cells = [
            f"{f['valid_tps']:.1f} ({f['valid_tps'] / raw['tps']:.1%})"
            for f in (summary["variants"][n]["fits"][i] for n in names)
        ]
        lines.append(f"| {i + 1} | {raw['tps']:.1f} | " + " | ".join(cells) + " |")
    total = []
    for n in names:
        r = summary["variants"][n]["ratio"]
        met = "met" if r >= TARGET_RATIO else f"missed by {100 * (TARGET_RATIO - r):.1f} points"
        total.append(f"{summary['variants'][n]['fit_tps']:.1f} (**{r:.1%}**, {met})")
    lines.append(f"| **all** | {summary['raw_tps']:.1f} | " + " | ".join(total) + " |")
    lines += [
        "",
        "Where the time went, summed over each variant's fit windows (seconds):",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    rows = summary["variants"][names[0]]["breakdown"]
    for key in rows:
        if "share" in key:
            lines.append(
                f"| {key} | "
                + " | ".join(f"{summary['variants'][n]['breakdown'][key]:.1%}" for n in names)
                + " |"
            )
            continue
        lines.append(
            f"| {key} | "
            + " | ".join(f"{summary['variants'][n]['breakdown'][key]:.2f}" for n in names)
            + " |"
        )
    return "\n".join(lines) + "\n"


def breakdown(fits: list[dict[str, Any]]) -> dict[str, float]:
    """Sums of the fits' windows: wall clock, trainer update and CPU, samplers' env/policy/rest."""
    tot = lambda k: sum(f[k] for f in fits)  # noqa: E731
    cpu: dict[str, float] = {}
    for f in fits:
        for k, v in f["cpu_s"].items():
            name = "trainer" if k == "trainer" else "samplers"
            cpu[name] = cpu.get(name, 0.0) + v
    wall = tot("wall_time")
    return {
        "window wall clock": tot("elapsed_s"),
        "trainer: in the training step (update)": tot("update_s"),
        "trainer: CPU": cpu.get("trainer", 0.0),
        "samplers: CPU": cpu.get("samplers", 0.0),
        "samplers: inside env.step": tot("step_time"),
        "samplers: inside env.reset": tot("reset_time"),
        "samplers: rest of the cycles (policy forward, bookkeeping)": wall
        - tot("step_time")
        - tot("reset_time"),
        # the share of the samplers' cores they computed on (the rest they waited, e.g. for weights)
        "samplers: busy share (cycle time / (samplers x wall clock))": wall
        / sum(f["elapsed_s"] * sum(k != "trainer" for k in f["cpu_s"]) for f in fits),
    }


def parse_variant(text: str) -> tuple[str, str | None, list[str]]:
    """``name=--flag=value --flag2=value`` -> (name, None, overrides); ``name@DIR=...`` launches the
    fit from ``DIR`` (another checkout: ``python -m fastlight`` imports the package from there, so
    code versions compare side by side); ``name=`` is the config as is."""
    head, sep, args = text.partition("=")
    name, _, tree = head.partition("@")
    if not sep or not name or name.startswith("-"):
        raise ValueError(
            f"--variants entries are NAME[@DIR]=OVERRIDES (e.g. apart=--data.rank_rounds=apart), got {text!r}"
        )
    if tree and not os.path.isfile(os.path.join(tree, "benchmarks", "overhead.py")):
        raise ValueError(f"variant {name}: {tree} has no benchmarks/overhead.py (copy this file there)")
    return name, tree or None, shlex.split(args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/highway_dpsa.yaml")
    p.add_argument(
        "--command",
        default=f"{shlex.quote(sys.executable)} -m fastlight",
        help="how to launch fastlight (shell words; default: this interpreter's -m fastlight)",
    )
    p.add_argument("--pairs", type=int, default=3, help="raw block + one fit per variant, repeated")
    p.add_argument("--batches", type=int, default=24, help="Rollout batches per fit (window's end)")
    p.add_argument("--warmup", type=int, default=4, help="Rollout batches before the window opens")
    p.add_argument("--raw-seconds", type=float, default=30.0, help="length of one raw-ceiling block")
    p.add_argument(
        "--variants",
        nargs="+",
        default=["config="],
        help="NAME=OVERRIDES fits compared side by side (order alternates between pairs), e.g. "
        "'apart=--data.rank_rounds=apart' 'together='",
    )
    p.add_argument("--out", help="write the results JSON here")
    a, extra = p.parse_known_args(argv)
    bad = [x for x in extra if not x.startswith("--")]
    if bad:
        p.error(f"unrecognised arguments {bad}: fit overrides are --<key>=<value>")
    for flag, v in (("--pairs", a.pairs), ("--warmup", a.warmup), ("--raw-seconds", a.raw_seconds)):
        if v <= 0:
            p.error(f"{flag} must be > 0, got {v}")
    if a.batches <= a.warmup:
        p.error(f"--batches must be > --warmup ({a.warmup}), got {a.batches}")
    try:
        parsed = [parse_variant(v) for v in a.variants]
    except ValueError as e:
        p.error(str(e))
    variants = {name: args for name, _, args in parsed}
    trees = {name: tree for name, tree, _ in parsed}
    command = "python -m benchmarks.overhead " + shlex.join(argv if argv is not None else sys.argv[1:])
    settings = data_settings(a.config, extra)
    for name, args in variants.items():
        if data_settings(a.config, [*extra, *args]) != settings:
            p.error(f"variant {name} changes the envs or sampler count: the raw ceiling would differ")
    load0 = os.getloadavg()[0]
    raw_blocks: list[dict[str, float]] = []
    fits: dict[str, list[dict[str, Any]]] = {n: [] for n in variants}
    ceiling = RawCeiling(**settings)
    try:
        ceiling.block(min(5.0, a.raw_seconds))  # envs warm, first resets out of the timing
        for i in range(a.pairs):
            raw_blocks.append(ceiling.block(a.raw_seconds))
            load = os.getloadavg()[0]
            print(f"[pair {i + 1}] raw {raw_blocks[-1]['tps']:.1f} env-steps/s, load {load:.1f}", flush=True)
            order = list(variants) if i % 2 == 0 else list(variants)[::-1]
            for name in order:
                with tempfile.TemporaryDirectory() as root:
                    f = run_fit(
                        shlex.split(a.command),
                        os.path.abspath(a.config),  # the same file for a variant run from another tree
                        root,
                        batches=a.batches,
                        warmup=a.warmup,
                        extra=[*extra, *variants[name]],
                        cwd=trees[name],
                    )
                fits[name].append(f)
                print(
                    f"[pair {i + 1}] {name}: {f['valid_tps']:.1f} valid env-steps/s over "
                    f"{f['elapsed_s']:.1f} s "
                    f"(update {f['update_s']:.1f} s), load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    finally:
        ceiling.close()
    raw_tps = sum(b["steps"] for b in raw_blocks) / sum(b["elapsed_s"] for b in raw_blocks)
    summary: dict[str, Any] = {
        "command": command,
        "settings": settings,
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg()[0],
        "raw": raw_blocks,
        "raw_tps": raw_tps,
        "variants": {},
    }
    for name, runs in fits.items():
        fit_tps = sum(f["valid_steps"] for f in runs) / sum(f["elapsed_s"] for f in runs)
        summary["variants"][name] = {
            "overrides": variants[name],
            "tree": trees[name],
            "fits": runs,
            "fit_tps": fit_tps,
            "ratio": fit_tps / raw_tps,
            "breakdown": breakdown(runs),
        }
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
