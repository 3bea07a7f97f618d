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
from fastlight.envs.wrappers import check_env_wrappers
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.start import check_start_method
from fastlight.inference.settings import InferenceSettings
from fastlight.procs import spare_threads, usable_cores
from fastlight.sampling.collector_settings import check_collector_settings
from fastlight.sampling.round_signal import RANK_ROUNDS, together_blockers


def check_data_settings(args: dict[str, Any]) -> None:
    """Every ``RolloutDataModule`` setting's check (``args``: its constructor's arguments), before
    anything is built; errors name the CLI flag."""
    check_start_method(args["start_method"])
    mode, num_envs, num_workers = args["reset_mode"], args["num_envs"], args["num_workers"]
    check_collector_settings(
        mode=mode,
        num_envs=num_envs if mode != "sequential" else 1,
        termination_threshold=args["termination_threshold"],
        max_horizon=args["max_horizon"],
        rollout_steps=args["rollout_steps"],
        nonfinite=args["nonfinite"],
    )
    for name in ("prefetch", "num_workers", "cycles_per_step", "steps_per_epoch", "group_size"):
        if args[name] <= 0:
            raise ValueError(f"--data.{name} must be > 0, got {args[name]}")
    group = args["group_size"]
    uneven = num_envs % num_workers or (num_envs // num_workers) % group
    if group > 1 and (uneven or mode not in ("dpsa", "sgr")):
        raise ValueError(
            f"--data.group_size {group} must divide each sampler's envs (--data.num_envs {num_envs} / "
            f"--data.num_workers {num_workers}) with --data.reset_mode dpsa or sgr (got {mode})"
        )
    if num_workers > num_envs:
        raise ValueError(f"--data.num_workers must be <= --data.num_envs ({num_envs}), got {num_workers}")
    if mode == "sequential" and num_workers != num_envs:
        raise ValueError(
            "--data.reset_mode sequential runs one env per sampler: set --data.num_envs equal "
            f"to --data.num_workers, got num_envs={num_envs}, num_workers={num_workers}"
        )
    valid = args["valid_steps_per_step"]
    if valid is not None and valid < 1:
        raise ValueError(f"--data.valid_steps_per_step must be null or >= 1, got {valid}")
    threads = args["trainer_threads"]
    if threads is not None and threads < 1:
        raise ValueError(f"--data.trainer_threads must be null (auto) or >= 1, got {threads}")
    if args["max_staleness"] < 0:
        raise ValueError(f"--data.max_staleness must be >= 0, got {args['max_staleness']}")
    check_rank_rounds(args)
    check_type("inference", args["inference"], InferenceSettings, optional=True)
    check_type("faults", args["faults"], FaultSettings)
    check_env_wrappers(args["env_wrappers"] or ())


def check_rank_rounds(args: dict[str, Any]) -> None:
    """``--data.rank_rounds together`` ends a rank's rounds together through the trainer machine's
    memory (:mod:`fastlight.sampling.round_signal`); refuse what it cannot mean (``auto`` falls back to
    ``apart`` there instead)."""
    value = args["rank_rounds"]
    if value not in RANK_ROUNDS:
        raise ValueError(f"--data.rank_rounds must be one of {', '.join(RANK_ROUNDS)}, got {value!r}")
    if value != "together":
        return
    fleet = args["fleet"]
    if not fleet.shared_memory:
        raise ValueError(
            f"--data.rank_rounds together signals through the trainer machine's memory, which "
            f"{type(fleet).__name__}'s samplers cannot read: use auto or apart"
        )
    for flag, (value, allowed) in rank_rounds_blockers(args).items():
        raise ValueError(
            f"--data.rank_rounds together with --data.max_staleness 0 shares one termination rate, "
            f"which needs {flag} {allowed} (the rank's samplers must sample the same cycles on the same "
            f"weights), got {value!r}; --data.rank_rounds auto ends them together only where it can"
        )


def rank_rounds_blockers(args: Mapping[str, Any]) -> dict[str, tuple[object, str]]:
    return together_blockers(
        reset_mode=args["reset_mode"],
        max_staleness=args["max_staleness"],
        termination_threshold=args["termination_threshold"],
        cycles_per_step=args["cycles_per_step"],
    )


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
    DataModule's hparams): every env stepping for the whole cycle (``max_horizon`` in dpsa/sgr,
    ``rollout_steps`` otherwise)."""
    steps = h.max_horizon if h.reset_mode in ("dpsa", "sgr") else h.rollout_steps
    return max(h.num_envs * h.cycles_per_step * steps, h.valid_steps_per_step or 0)


def check_minibatches(h: Any, module: object) -> None:
    """Refuse, before any sampler starts, a ``--model.num_minibatches`` that no Rollout can fill:
    it would split every Rollout into empty minibatches. (A module without that setting, e.g. a
    plain Lightning project's own or the sampling benchmark's fixed policy, is not checked.)"""
    if not isinstance(module, L.LightningModule):
        return
    wanted, most = module.hparams.get("num_minibatches"), max_valid_per_rollout(h)
    if wanted is not None and wanted > most:
        cycle = "max_horizon" if h.reset_mode in ("dpsa", "sgr") else "rollout_steps"
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
    """The trainer's torch threads (None: leave them) and the inference settings to start the
    worker with (``ranks_here`` ranks on this machine, the trainer on ``device``): the cores the
    samplers leave (:func:`~fastlight.procs.spare_threads`), split between the trainer and a CPU
    inference worker, unless ``--data.trainer_threads`` / ``--data.inference.threads`` set them.
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
    why = (
        "--data.trainer_threads"
        if settings["trainer_threads"] is not None
        else f"the cores its {settings['num_workers']} samplers leave (--data.trainer_threads sets it)"
    )
    return f"fastlight: the trainer computes on {threads} torch thread(s){worker}: {why}"
