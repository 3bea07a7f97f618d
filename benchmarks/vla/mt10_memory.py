"""Memory of each MT10 sampler process of a real ``fastlight fit`` run (VmRSS from ``/proc``).

    nice -n 5 python -m benchmarks.vla.mt10_memory --minutes 10
    python -m benchmarks.vla.mt10_memory --minutes 5 --pythonpath /tmp/mt10_before   # another tree
    python -m benchmarks.vla.mt10_memory --step-cost   # what sharing costs per env step
    python -m benchmarks.vla.mt10_memory --breakdown   # a sampler's memory piece by piece

Launches ``python -m fastlight fit --config configs/vla_metaworld_mt10.yaml --model.init_from null``
(RL from a random policy: no SFT checkpoint needed) in its own process group, reads
``/proc/<pid>/status`` of every sampler process each ``--every`` seconds and, after ``--minutes``,
stops the run (SIGTERM, then SIGKILL, to that process group only).

A sampler's memory grows with the MuJoCo models its envs build, so a reading means something only
once every task has been met. :class:`TaskLog` (added around every env with
``--data.env_wrappers``) makes each sampler write which tasks its envs have reset into, and which
(env, task) pairs: each reading prints both next to the memory. The samplers are the processes
below the ``fit`` process that wrote such a log (the trainer's probe env never resets).

``--pythonpath DIR`` puts ``DIR`` first on the run's ``PYTHONPATH``: a copy of the package with
one file swapped measures that file (``benchmarks/results/vla_mt10_memory.md`` does so for the
before/after numbers).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from benchmarks import child_env
from benchmarks.procfs import descendants, memory_mb
from fastlight.envs.wrappers import EnvWrapper

COMMAND = "python -m benchmarks.vla.mt10_memory"
CONFIG = "configs/vla_metaworld_mt10.yaml"

#: Large imports a sampler may carry besides torch and the env: each reading says which it has.
HEAVY_MODULES = ("transformers", "peft", "accelerate", "PIL", "scipy", "sympy", "lightning")

_ENV_INDEX = itertools.count()  # envs built by this process, in order


class TaskLog(EnvWrapper):
    """Each env records the tasks it resets into; the process writes ``<dir>/<pid>.json``
    (``tasks``: the task ids any of its envs met; ``pairs``: distinct (env, task) pairs) whenever
    either grows."""

    def __init__(self, dir: str) -> None:
        self.dir = dir

    def wrap(self, env: gym.Env) -> gym.Env:
        return _TaskLogEnv(env, self.dir, next(_ENV_INDEX))


_MET: set[tuple[int, int]] = set()  # (env index, task id) pairs met in this process
_MET_LOCK = threading.Lock()


class _TaskLogEnv(gym.Wrapper):
    def __init__(self, env: gym.Env, dir: str, index: int) -> None:
        super().__init__(env)
        self._dir, self._index = dir, index

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        pair = (self._index, int(info["task_id"]))
        with _MET_LOCK:  # the Collector resets envs on a thread pool
            if pair in _MET:
                return obs, info
            _MET.add(pair)
            path = Path(self._dir) / f"{os.getpid()}.json"
            tmp = path.with_suffix(".tmp")
            module = sys.modules[type(self.env.unwrapped).__module__].__file__  # which file is measured
            heavy = sorted(m for m in HEAVY_MODULES if m in sys.modules)  # what else the sampler imported
            log = {
                "tasks": sorted({t for _, t in _MET}),
                "pairs": len(_MET),
                "env_module": module,
                "heavy": heavy,
            }
            tmp.write_text(json.dumps(log))
            tmp.replace(path)  # a reader never sees half a file
        return obs, info


def read_samplers(fit_pid: int, log_dir: str) -> list[dict[str, Any]]:
    """Memory (MB) and tasks met of each sampler below ``fit_pid`` that wrote a task log."""
    below = descendants(fit_pid)
    out = []
    for path in sorted(Path(log_dir).glob("*.json")):
        pid = int(path.stem)
        if pid not in below:
            continue
        try:
            log = json.loads(path.read_text())
            mem = memory_mb(pid)
        except (OSError, ValueError):  # the sampler just exited
            continue
        out.append(
            {
                "pid": pid,
                **mem,
                "tasks_met": len(log["tasks"]),
                "pairs_met": log["pairs"],
                "env_module": log["env_module"],
                "heavy_imports": log["heavy"],
            }
        )
    return out


def stop_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the run's process group, SIGKILL what is left after ``grace_s``."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # samplers that outlived the trainer
    except ProcessLookupError:
        pass
    proc.wait()


def step_cost(envs_n: int = 8, steps: int = 300, rounds: int = 3) -> dict[str, float]:
    """Seconds per env step of ``envs_n`` state-only MT10 envs stepped in turn (a sampler's order),
    with the process's shared models and with one model per env and task, alternating round by
    round; every env plays task ``i % 10`` (all different for 8 envs: each step swaps no state)
    or all the same task (every step swaps one in): both extremes of a sampler's mix."""
    import numpy as np

    from fastlight.envs.metaworld import MetaWorldEnv

    class OwnModels(MetaWorldEnv):
        _share_models = False

    out: dict[str, list[float]] = {}
    for _ in range(rounds):
        for cls in (MetaWorldEnv, OwnModels):
            for mix in ("distinct", "same"):
                envs = [cls("MT10", image=False, max_path_length=10_000) for _ in range(envs_n)]
                for i, env in enumerate(envs):
                    env.reset(seed=i, options={"task_id": i % 10 if mix == "distinct" else 0})
                action = np.zeros(4, dtype=np.float32)
                t = time.perf_counter()
                for _ in range(steps):
                    for env in envs:
                        env.step(action)
                name = f"{'shared' if cls is MetaWorldEnv else 'own'}/{mix}"
                out.setdefault(name, []).append((time.perf_counter() - t) / (steps * envs_n))
                for env in envs:
                    env.close()
    return {k: min(v) for k, v in out.items()}


def breakdown(config: str = CONFIG, num_envs: int = 8) -> list[tuple[str, float]]:
    """VmRSS (MB) of this process after each piece a sampler of ``config`` adds, in a sampler's
    order: its own imports, its envs, its policy (a sampler unpickles the one the trainer built,
    which imports what building it imports; none with the config's inference worker), the first
    task, then every env through every task (one state-only MT10 run; call it in a fresh process)."""
    import yaml

    def vmrss() -> float:
        return memory_mb(os.getpid())["VmRSS"]

    out = [("python and this script's imports (torch, gymnasium)", vmrss())]
    import fastlight.sampling.worker  # noqa: F401  (torch, the Collector: what every sampler imports)

    out.append(("the sampler's imports (torch, fastlight.sampling)", vmrss()))
    from fastlight.envs.registry import make_env

    with open(config) as f:
        cfg = yaml.safe_load(f)
    data = cfg["data"]["init_args"]
    envs = [make_env(data["env_id"], env_kwargs=data["env_kwargs"]) for _ in range(num_envs)]
    out.append((f"{num_envs} MT10 envs made (metaworld, the instruction tokenizer)", vmrss()))
    if data.get("inference") is None:  # else the inference worker holds the policy, not the sampler
        from fastlight.vla.policy import VLAPolicy

        VLAPolicy(**cfg["model"]["init_args"]["policy"]["init_args"])
        out.append(("the config's VLAPolicy (its backbone's imports)", vmrss()))
    envs[0].reset(seed=0, options={"task_id": 0})
    out.append(("first task: its 50 goals and its model", vmrss()))
    for k in range(10):
        for i, env in enumerate(envs):
            env.reset(seed=i if k == 0 else None, options={"task_id": (k + i) % 10})
    out.append((f"every env through every task ({num_envs} x 10 resets)", vmrss()))
    for env in envs:
        env.close()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="training time before the last reading")
    parser.add_argument("--every", type=float, default=60.0, help="seconds between readings")
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--pythonpath", default=None, help="prepended to the run's PYTHONPATH")
    parser.add_argument("--out", default=None, help="write the readings here (JSON)")
    parser.add_argument("--step-cost", action="store_true", help="only time env steps, shared vs own models")
    parser.add_argument(
        "--breakdown", action="store_true", help="only a sampler's memory piece by piece, here"
    )
    parser.add_argument("args", nargs="*", help="more `fastlight fit` arguments (after --)")
    a = parser.parse_args(argv)
    if a.breakdown:
        prev = None
        for what, mb in breakdown(a.config):
            print(f"{mb:7.0f} MB  {'' if prev is None else f'{mb - prev:+5.0f}'}  {what}")
            prev = mb
        return
    if a.step_cost:
        costs = step_cost()
        for name, s in costs.items():
            print(f"{name:16s} {s * 1e6:7.1f} us per env step (best of 3 rounds)")
        return
    if a.minutes <= 0 or a.every <= 0:
        parser.error(f"--minutes and --every must be > 0, got {a.minutes} and {a.every}")
    with tempfile.TemporaryDirectory(prefix="mt10_memory_") as root:
        log_dir = os.path.join(root, "tasks")
        os.mkdir(log_dir)
        wrapper = json.dumps(
            [{"class_path": "benchmarks.vla.mt10_memory.TaskLog", "init_args": {"dir": log_dir}}]
        )
        # max_time: the run ends by itself should this script die before it stops it.
        limit = int(a.minutes) + 5
        max_time = f"00:{limit // 60:02d}:{limit % 60:02d}:00"
        command = [
            sys.executable, "-m", "fastlight", "fit", "--config", os.path.abspath(a.config),
            "--model.init_from", "null", f"--trainer.default_root_dir={root}/run",
            f"--trainer.max_time={max_time}", "--trainer.enable_progress_bar=false",
            f"--data.env_wrappers={wrapper}", *a.args,
        ]  # fmt: skip
        env = child_env()
        env.setdefault("MUJOCO_GL", "egl")
        # The run starts in `root`, not here: `python -m` puts its working directory first on
        # sys.path, which would shadow --pythonpath with this checkout's package.
        if a.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join((os.path.abspath(a.pythonpath), env["PYTHONPATH"]))
        print(f"$ {shlex.join(command)}", flush=True)
        log = open(os.path.join(root, "fit.log"), "w")
        proc = subprocess.Popen(
            command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        t0, readings = time.time(), []
        try:
            while True:
                left = a.minutes * 60 - (time.time() - t0)
                time.sleep(max(0.0, min(a.every, left)))
                if proc.poll() is not None:
                    log.flush()
                    tail = Path(root, "fit.log").read_text()[-3000:]
                    raise RuntimeError(f"the run exited ({proc.returncode}) before the last reading:\n{tail}")
                elapsed = time.time() - t0
                samplers = read_samplers(proc.pid, log_dir)
                readings.append({"s": round(elapsed), "load_1min": os.getloadavg()[0], "samplers": samplers})
                cells = ", ".join(
                    f"pid {s['pid']}: VmRSS {s['VmRSS']:.0f} MB (RssAnon {s['RssAnon']:.0f}), "
                    f"{s['tasks_met']} tasks / {s['pairs_met']} env-task pairs met"
                    for s in samplers
                )
                print(f"[{elapsed / 60:5.1f} min, load {os.getloadavg()[0]:.1f}] {cells}", flush=True)
                if elapsed >= a.minutes * 60:
                    break
        finally:
            stop_group(proc)
            log.close()
    last = readings[-1]["samplers"]
    summary = {
        "command": f"{COMMAND} {shlex.join(argv if argv is not None else sys.argv[1:])}",
        "fit": shlex.join(command[1:]),
        "pythonpath": a.pythonpath,
        "minutes": a.minutes,
        "sampler_vmrss_mb": [round(s["VmRSS"]) for s in last],
        "sampler_rssanon_mb": [round(s["RssAnon"]) for s in last],
        "sampler_tasks_met": [s["tasks_met"] for s in last],
        "sampler_pairs_met": [s["pairs_met"] for s in last],
        "env_module": sorted({s["env_module"] for s in last}),
        "sampler_heavy_imports": [s["heavy_imports"] for s in last],
        "readings": readings,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "readings"}, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
