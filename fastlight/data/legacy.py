"""Flat ``RolloutDataModule`` settings that moved into typed settings objects, and where to.

Configs and command lines that still use one are refused with one line saying what to write
instead (:func:`refuse_moved`, used by the ``fastlight`` CLI). Checkpoints that recorded the old
flat hparams are mapped to the new shape (:func:`upgrade_hparams`), so reading an old run's data
settings (``fastlight evaluate``) sees the same names a new run writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_INFERENCE = {
    "inference_device": "device",
    "max_batch": "max_batch",
    "max_wait_ms": "max_wait_ms",
    "sync_bucket_mb": "sync_bucket_mb",
    "sync_timeout_s": "sync_timeout_s",
}
_FAULTS = ("worker_timeout_s", "max_worker_restarts", "restart_window_s", "heartbeat_s")
_LOAD_COST = "fastlight.envs.ScenarioLoadCost"

#: Old flat name -> what to write instead.
MOVED: dict[str, str] = {
    "inference_server": "--data.inference '{}' (an inference worker with default settings; null = none)",
    **{old: f"--data.inference.{new}" for old, new in _INFERENCE.items()},
    **{old: f"--data.faults.{old}" for old in _FAULTS},
    "scenario_load_cost_s": (
        f"--data.env_wrappers '[{{class_path: {_LOAD_COST}, init_args: {{seconds: S}}}}]' (an env wrapper)"
    ),
}


def moved_line(name: str) -> str:
    """The one line that refuses old setting ``name``."""
    return f"--data.{name} has moved: write {MOVED[name]}"


def refuse_moved(names: Iterable[str]) -> None:
    """Raise ``ValueError`` (one line) for the first of ``names`` that is an old flat setting."""
    for name in names:
        if name in MOVED:
            raise ValueError(moved_line(name))


def upgrade_hparams(hparams: dict[str, Any]) -> dict[str, Any]:
    """Old flat data hparams -> the settings objects' shape (plain data, as the CLI records it).

    ``inference_server`` false (or absent) drops the inference knobs with it: no worker used them.
    """
    out = {k: v for k, v in hparams.items() if k not in MOVED}
    if hparams.get("inference_server"):
        out["inference"] = {new: hparams[old] for old, new in _INFERENCE.items() if old in hparams}
    faults = {k: hparams[k] for k in _FAULTS if k in hparams}
    if faults:
        out["faults"] = {**(hparams.get("faults") or {}), **faults}
    cost = hparams.get("scenario_load_cost_s") or 0.0
    if cost > 0:
        wrapper = {"class_path": _LOAD_COST, "init_args": {"seconds": float(cost)}}
        out["env_wrappers"] = [*(hparams.get("env_wrappers") or []), wrapper]
    return out
