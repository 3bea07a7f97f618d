"""Checking and recording ``RolloutDataModule``'s settings: one check per setting, naming its CLI
flag, and the settings objects as plain data for loggers and checkpoints."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch

from fastlight.class_paths import class_path as import_path
from fastlight.data.sampler_plan import RANK_ROUNDS
from fastlight.envs.wrappers import check_env_wrappers
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.start import check_start_method
from fastlight.inference.settings import InferenceSettings
from fastlight.procs import spare_threads, usable_cores
from fastlight.sampling.collector_settings import COLLECTOR_RANGES, RESET_MODES, Range, check_ranges

#: ``RolloutDataModule``'s settings with a range, in the order they are checked (the Collector's first).
DATA_RANGES: dict[str, Range] = COLLECTOR_RANGES | {
    "prefetch": (lambda v: v > 0, "> 0"),
    "num_workers": (lambda v: v > 0, "> 0"),
    "cycles_per_step": (lambda v: v > 0, "> 0"),
    "steps_per_epoch": (lambda v: v > 0, "> 0"),
    "group_size": (lambda v: v > 0, "> 0"),
    "valid_steps_per_step": (lambda v: v is None or v >= 1, "null or >= 1"),
    "trainer_threads": (lambda v: v is None or v >= 1, "null (auto) or >= 1"),
    "max_staleness": (lambda v: v >= 0, ">= 0"),
    "rank_rounds": (lambda v: v in RANK_ROUNDS, "one of " + " | ".join(RANK_ROUNDS)),
}


def check_data_settings(args: dict[str, Any]) -> None:
    """Every ``RolloutDataModule`` setting's check (``args``: its constructor's arguments), before
    anything is built; errors name the CLI flag (``rank_rounds``: :func:`resolve_rank_rounds`)."""
    check_start_method(args["start_method"])
    check_ranges(args, DATA_RANGES)
    mode, num_envs, num_workers = args["reset_mode"], args["num_envs"], args["num_workers"]
    group = args["group_size"]
    uneven = num_envs % num_workers or (num_envs // num_workers) % group
    if group > 1 and (uneven or not RESET_MODES[mode].cycles):
        cycled = " or ".join(m for m, traits in RESET_MODES.items() if traits.cycles)
        raise ValueError(
            f"--data.group_size {group} must divide each sampler's envs (--data.num_envs {num_envs} / "
            f"--data.num_workers {num_workers}) with --data.reset_mode {cycled} (got {mode})"
        )
    if num_workers > num_envs:
        raise ValueError(f"--data.num_workers must be <= --data.num_envs ({num_envs}), got {num_workers}")
    if RESET_MODES[mode].one_env and num_workers != num_envs:
        raise ValueError(
            f"--data.reset_mode {mode} runs one env per sampler: set --data.num_envs equal "
            f"to --data.num_workers, got num_envs={num_envs}, num_workers={num_workers}"
        )
    check_type("inference", args["inference"], InferenceSettings, optional=True)
    check_type("faults", args["faults"], FaultSettings)
    check_env_wrappers(args["env_wrappers"] or ())


def check_type(name: str, value: object, cls: type, *, optional: bool = False) -> None:
    """A programmatic caller's wrong object (a dict, an old flag's bool) named, not used."""
    if (value is None and optional) or isinstance(value, cls):
        return
    allowed = f"null or {cls.__name__}(...)" if optional else f"{cls.__name__}(...)"
    raise TypeError(f"--data.{name} must be {allowed} ({cls.__module__}), got {value!r}")


def plain_settings(value: Any, *, class_path: bool = False) -> Any:
    """A settings object as a config writes it: its fields (``class_path`` + ``init_args`` for an
    env wrapper, whose class is open); plain data (the CLI's) as it is."""
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, type | functools.partial):  # a gymnasium wrapper class (awaiting its env)
        func, init_args = (value, {}) if isinstance(value, type) else (value.func, dict(value.keywords))
        return {"class_path": import_path(func), "init_args": init_args}
    fields = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else dict(vars(value))
    if not class_path:
        return fields
    return {"class_path": import_path(type(value)), "init_args": fields}


def max_valid_per_rollout(h: Any) -> int:
    """The most valid transitions one training step's Rollout can hold on a rank (``h``: the
    DataModule's hparams): every env stepping for the whole cycle."""
    return max(h.num_envs * h.cycles_per_step * h[_cycle(h)], h.valid_steps_per_step or 0)


def _cycle(h: Any) -> str:
    """The setting that caps a Rollout's env steps per env and cycle."""
    return "max_horizon" if RESET_MODES[h.reset_mode].cycles else "rollout_steps"


def check_minibatches(h: Any, module: object) -> None:
    """Refuse a ``--model.num_minibatches`` that no Rollout can fill (a module without it passes)."""
    if not isinstance(module, L.LightningModule):
        return
    wanted, most = module.hparams.get("num_minibatches"), max_valid_per_rollout(h)
    if wanted is not None and wanted > most:
        cycle = _cycle(h)
        raise ValueError(
            f"--model.num_minibatches must be <= {most}, the most valid "
            f"transitions a Rollout can hold (--data.num_envs {h.num_envs} x --data.cycles_per_step "
            f"{h.cycles_per_step} x --data.{cycle} {h[cycle]}), got {wanted}"
        )


def thread_plan(
    h: Any,
    inference: InferenceSettings | None,
    *,
    shared_memory: bool,
    ranks_here: int,
    device: torch.device | str = "cpu",
) -> tuple[int | None, InferenceSettings | None]:
    """The trainer's torch threads (None: leave them) and the inference worker's settings: the cores
    the samplers leave, split between the trainer and a CPU inference worker, unless set explicitly.
    Unchanged when ``OMP_NUM_THREADS`` is set or the fleet is remote (``shared_memory`` false)."""
    if not shared_memory or os.environ.get("OMP_NUM_THREADS"):
        return h.trainer_threads, inference
    spare = spare_threads(cores=usable_cores(), ranks=ranks_here, busy=h.num_workers)
    cpu_worker = inference is not None and inference.worker_device(device).type == "cpu"
    if cpu_worker and inference.threads is None:
        inference = dataclasses.replace(inference, threads=max(1, spare // 2))
    worker = inference.threads if cpu_worker else 0
    trainer = h.trainer_threads if h.trainer_threads is not None else max(1, spare - worker)
    return trainer, inference


def threads_line(settings: Mapping[str, Any], threads: int, inference: InferenceSettings | None) -> str:
    """The line that says how many torch threads the trainer computes on (set by :func:`thread_plan`)."""
    served = inference is not None and inference.threads is not None
    worker = f", the inference worker on {inference.threads}" if served else ""
    why = f"the cores its {settings['num_workers']} samplers leave (--data.trainer_threads sets it)"
    if settings["trainer_threads"] is not None:
        why = "--data.trainer_threads"
    return f"fastlight: the trainer computes on {threads} torch thread(s){worker}: {why}"
