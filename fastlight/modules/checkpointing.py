"""What an ``RLModule`` records in its hparams, and what it checks when a checkpoint loads.

**Hparams.** ``save_hyperparameters`` of the whole ``__init__`` chain. Built by LightningCLI, they hold
``policy`` as the CLI config (``class_path`` / ``init_args``); a policy passed as a Python object is
kept as its class path only (loading asks for the object again). The objective is held as its config.
"""

from __future__ import annotations

from types import FrameType
from typing import Any

import lightning as L
import torch
from torch import nn

from fastlight.class_paths import class_path, same_class
from fastlight.lightning_compat import record_hparams
from fastlight.modules.objectives import Objective
from fastlight.modules.weights_fit import first_misfit, setting_differences

#: The hparams key LightningCLI's instantiator leaves: the module was built from a CLI config.
_CLI = "_instantiator"


def save_hparams(
    module: L.LightningModule, policy: nn.Module | None, objective: Objective, *, frame: FrameType | None
) -> None:
    """``save_hyperparameters`` of the ``__init__`` chain at ``frame``, policy and objective as plain data."""
    module.save_hyperparameters(ignore=["policy"], frame=frame)
    if _CLI in module.hparams:
        module.save_hyperparameters(frame=frame)  # the CLI's config: policy is plain data there
        return
    policy_path = None if policy is None else class_path(type(policy))
    record_hparams(module, {"policy": policy_path, "objective": objective.config()})


def keep_policy_config(module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
    """Rebuilt from a CLI checkpoint, keep its policy config (and its class path, if of this class)."""
    saved = checkpoint.get(module.CHECKPOINT_HYPER_PARAMS_KEY) or {}
    config, mine = saved.get("policy"), module.hparams.get("policy")
    mine = mine.get("class_path") if isinstance(mine, dict) else mine  # a CLI run's is its config
    if not isinstance(config, dict) or not same_class(mine, config.get("class_path")):
        return
    values = {"policy": config}
    if same_class(saved.get("_class_path"), class_path(type(module))) and _CLI in saved:
        values.update(_class_path=saved["_class_path"], _instantiator=saved[_CLI])
    record_hparams(module, values)


def check_weights_fit(module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
    """Refuse, in one line, a checkpoint whose weights ``module`` cannot load: the settings that differ
    from the checkpoint's and the first tensor that does not fit. Not checked under a strategy that
    restores after wrapping the model (FSDP, DeepSpeed), whose module holds shards here."""
    theirs = checkpoint.get("state_dict")
    trainer = module._trainer
    if not isinstance(theirs, dict) or not theirs or "policy" not in module._modules:
        return  # no weights to load (a hook called on its own), or no policy to load them into
    if trainer is not None and trainer.strategy.restore_checkpoint_after_setup:
        return
    misfit = first_misfit(module.state_dict(), theirs, strict=module.strict_loading)
    if misfit is None:
        return
    dm = trainer.datamodule if trainer is not None else None
    data = dict(dm.hparams) if isinstance(dm, L.LightningDataModule) else {}
    saved = checkpoint.get(module.CHECKPOINT_HYPER_PARAMS_KEY) or {}
    diffs = setting_differences(
        saved, dict(module.hparams), checkpoint.get("datamodule_hyper_parameters") or {}, data
    )
    path = trainer.ckpt_path if trainer is not None else None
    where = f"--ckpt_path {path}: " if path else ""
    if diffs:
        why = f"{'; '.join(diffs)}: the checkpoint's weights cannot be loaded into this model"
    else:  # same settings, other shapes: the class itself (or its code) changed
        why = (
            f"the checkpoint's weights cannot be loaded into this model (--model.class_path "
            f"{class_path(type(module))}, with the checkpoint's settings)"
        )
    raise ValueError(
        f"{where}{why} ({misfit}); resume with the checkpoint's settings, or start a new run without "
        "--ckpt_path"
    )


def use_typed_learning_rates(module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
    """Resuming with a changed ``lr`` (or ``*_lr``) means the new one: edits the checkpoint's optimizer
    param groups (a sharded checkpoint's: the trainer's optimizers, already loaded) to ``module``'s rates."""
    saved = checkpoint.get(module.CHECKPOINT_HYPER_PARAMS_KEY) or {}
    rates = [k for k in module.hparams if k == "lr" or k.endswith("_lr")]
    changed = [k for k in rates if k in saved and saved[k] != module.hparams[k]]
    states = checkpoint.get("optimizer_states")
    if states:
        targets = [state["param_groups"] for state in states]
    elif module._trainer is not None:  # sharded: no optimizer states here, the strategy loaded them in place
        targets = [opt.param_groups for opt in module.trainer.optimizers]
    else:
        targets = []
    if not changed or not targets or "policy" not in module._modules:
        return
    fresh = module.configure_optimizers()
    opts = list(fresh) if isinstance(fresh, (list, tuple)) else [fresh]
    if len(opts) != len(targets) or not all(isinstance(o, torch.optim.Optimizer) for o in opts):
        return
    for opt, groups in zip(opts, targets, strict=True):
        for group, saved_group in zip(opt.param_groups, groups, strict=False):
            saved_group["lr"] = group["lr"]
