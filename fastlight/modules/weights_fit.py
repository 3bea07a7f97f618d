"""Why a checkpoint's weights do not fit a module: the first tensor of another shape and the settings
that differ, as one line (resuming with another ``--model.hidden_sizes`` or ``--data.env_id``), where
``load_state_dict`` would list every tensor in a long ``size mismatch`` traceback."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor

#: RLModule and RolloutDataModule settings that cannot change a tensor's shape: a resume that cannot
#: load the weights does not list them among the settings that differ.
_NOT_SHAPES = frozenset(
    {
        "lr", "gamma", "gae_lambda", "update_epochs", "num_minibatches", "objective", "ratio_granularity",
        "tokens_per_action", "vf_coef", "ent_coef", "value_clip_eps", "max_grad_norm",
        "normalize_advantages", "recompute_values", "init_from", "value_warmup_updates",
        "max_nonfinite_updates",
    }
)  # fmt: skip
_DATA_NOT_SHAPES = frozenset(
    {
        "num_envs", "num_workers", "reset_mode", "termination_threshold", "max_horizon", "rollout_steps",
        "cycles_per_step", "valid_steps_per_step", "max_staleness", "prefetch", "inference", "faults",
        "steps_per_epoch", "seed", "nonfinite", "start_method", "fleet",
    }
)  # fmt: skip
#: Model sizes the CLI links from the data module: named as the env's, not as settings to type.
_ENV_SIZES = ("obs_dim", "action_dim", "continuous", "spaces")


def first_misfit(mine: dict[str, Any], theirs: dict[str, Any], *, strict: bool) -> str | None:
    """What keeps ``theirs`` (a checkpoint's state dict) from loading into ``mine``: the first tensor
    of another shape (and how many there are), else with ``strict`` the first missing or unexpected
    key; None when it loads."""
    shaped = [
        (k, tuple(v.shape), tuple(theirs[k].shape))
        for k, v in mine.items()
        if k in theirs and hasattr(v, "shape") and hasattr(theirs[k], "shape") and v.shape != theirs[k].shape
    ]
    if shaped:
        key, here, there = shaped[0]
        n = len(shaped) - 1
        more = "" if not n else "; 1 more tensor differs" if n == 1 else f"; {n} more tensors differ"
        return f"{key} is {list(here)} here, {list(there)} in the checkpoint{more}"
    if not strict:
        return None
    missing = [k for k in mine if k not in theirs]
    unexpected = [k for k in theirs if k not in mine]
    if missing:
        return f"{missing[0]} is not in the checkpoint ({len(missing)} tensors missing)"
    if unexpected:
        return f"the checkpoint holds {unexpected[0]}, which this model lacks ({len(unexpected)} such)"
    return None


def setting_differences(
    saved: dict[str, Any], mine: dict[str, Any], saved_data: dict[str, Any], data: dict[str, Any]
) -> list[str]:
    """``--data.<key> <yours> (checkpoint: <theirs>)``, then the same for ``--model.``, for the
    settings both sides hold that may shape a tensor; then the env's sizes that differ."""
    out = differences("--data.", data, saved_data, skip=_DATA_NOT_SHAPES)
    out += differences("--model.", mine, saved, skip=_NOT_SHAPES | set(_ENV_SIZES))
    for key in _ENV_SIZES:
        if key in mine and key in saved and plain_setting(mine[key]) != plain_setting(saved[key]):
            yours, theirs = plain_setting(mine[key]), plain_setting(saved[key])
            out.append(f"the env's {key} {yours} (checkpoint: {theirs})")
    return out


def differences(prefix: str, mine: Any, theirs: dict[str, Any], *, skip: Iterable[str] = ()) -> list[str]:
    """``<prefix><key> <yours> (checkpoint: <theirs>)`` for each setting of ``mine`` (a dict or a
    Namespace) that ``theirs`` holds too and that differs, ``skip`` and ``_private`` keys aside; a nested
    setting names only its leaves that differ."""
    skipped = set(skip)
    return [
        line
        for key, value in plain_setting(mine or {}).items()
        if not key.startswith("_") and key not in skipped and key in theirs
        for line in _leaf_differences(f"{prefix}{key}", value, plain_setting(theirs[key]))
    ]


def _leaf_differences(flag: str, mine: Any, theirs: Any) -> list[str]:
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return [line for k in dict.fromkeys([*mine, *theirs])
                for line in _leaf_differences(f"{flag}.{k}", mine.get(k), theirs.get(k))]  # fmt: skip
    return [] if mine == theirs else [f"{flag} {mine} (checkpoint: {theirs})"]


def plain_setting(value: Any) -> Any:
    """Settings as a config writes them, so that a tuple and the list a checkpoint saved compare equal."""
    if hasattr(value, "as_dict"):  # a jsonargparse Namespace
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: plain_setting(v) for k, v in value.items() if k != "_instantiator"}
    if isinstance(value, (list, tuple)):
        return [plain_setting(v) for v in value]
    if isinstance(value, Tensor):
        return value.tolist()
    return value
