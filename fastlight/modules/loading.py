"""Loading a fastlight LightningModule from a checkpoint, of the class it records (``_class_path`` in its
hyperparameters, from LightningCLI). Reading the file itself is :mod:`fastlight.checkpoints`' job."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from fastlight.checkpoints import read_checkpoint
from fastlight.modules.rl_module import RLModule
from fastlight.safe_files import ALLOWED


def module_class(ckpt: dict[str, Any], default: type[L.LightningModule]) -> type[L.LightningModule]:
    """The LightningModule class a checkpoint was saved from (``default`` when it records none)."""
    path = (ckpt.get("hyper_parameters") or {}).get("_class_path")
    if not path:
        return default
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, L.LightningModule)):
        raise TypeError(f"{path} is not a LightningModule class")  # never called, whatever it is
    return cls


def load_module_of(path: str | Path, ckpt: dict[str, Any], *, flag: str = "--ckpt") -> L.LightningModule:
    """The module of checkpoint ``path`` (already read as ``ckpt``), of the class it records, on the
    CPU in eval mode with its policy built. Raises ``ValueError`` naming ``flag`` when the class cannot
    be imported, cannot be rebuilt from the file, or has no policy."""
    class_path = (ckpt.get("hyper_parameters") or {}).get("_class_path")
    try:
        cls = module_class(ckpt, RLModule)
    except (ImportError, AttributeError, TypeError) as e:
        raise ValueError(
            f"{flag}: cannot import the checkpoint's module class {class_path!r} ({type(e).__name__}: {e}); "
            "run from the directory that holds its package, or add that directory to PYTHONPATH"
        ) from e
    try:
        with torch.serialization.safe_globals(ALLOWED):
            module = cls.load_from_checkpoint(str(path), map_location="cpu", weights_only=True)
    except (RuntimeError, TypeError, KeyError) as e:
        recorded = "" if class_path else " (it records no class path, so it was loaded as RLModule)"
        raise ValueError(
            f"{flag}: cannot rebuild {cls.__module__}.{cls.__qualname__} from {path}{recorded}: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    module.eval()
    if not isinstance(module._modules.get("policy"), nn.Module):
        raise ValueError(f"{flag}: {cls.__qualname__} has no policy to evaluate")
    return module


def load_module(path: str | Path, *, flag: str = "--ckpt") -> L.LightningModule:
    """The module of checkpoint ``path`` on the CPU, in eval mode, with its policy built."""
    return load_module_of(path, read_checkpoint(path, flag=flag), flag=flag)
