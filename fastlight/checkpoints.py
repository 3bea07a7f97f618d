"""Loading a fastlight LightningModule from a checkpoint, whatever its class.

A checkpoint written by ``fastlight fit`` records the module's class (``_class_path`` in its
hyperparameters, from LightningCLI), so evaluation tools need not know whether it came from
``RLModule``, ``VLAModule``, ``VLASFTModule`` or a user's subclass.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import lightning as L
import torch


def read_checkpoint(path: str | Path, *, flag: str = "--ckpt") -> dict[str, Any]:
    """``torch.load`` a Lightning checkpoint on the CPU, naming the file when it is missing or not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{flag}: no checkpoint file at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling error means "not a checkpoint"
        raise ValueError(f"{flag}: {path} is not a readable checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ValueError(f"{flag}: {path} is not a Lightning checkpoint (no 'state_dict')")
    return ckpt


def module_class(ckpt: dict[str, Any], default: type[L.LightningModule]) -> type[L.LightningModule]:
    """The LightningModule class a checkpoint was saved from (``default`` when it records none)."""
    path = (ckpt.get("hyper_parameters") or {}).get("_class_path")
    if not path:
        return default
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def load_module(path: str | Path, *, flag: str = "--ckpt") -> L.LightningModule:
    """The module of checkpoint ``path`` on the CPU, in eval mode, with its policy built."""
    from fastlight.modules.rl_module import RLModule

    cls = module_class(read_checkpoint(path, flag=flag), RLModule)
    module = cls.load_from_checkpoint(str(path), map_location="cpu")
    module.eval()
    return module
