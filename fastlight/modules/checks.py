"""``RLModule``'s refusals: bad settings up front, and a policy used or built at the wrong time, each
one line naming the CLI flag and what to do."""

from __future__ import annotations

from typing import Any

from torch import nn

from fastlight.class_paths import class_path
from fastlight.losses.ratios import GRANULARITIES
from fastlight.models.spaces import refusal


def check_settings(args: dict[str, Any], *, default_policy: bool) -> None:
    """Refuse bad ``RLModule.__init__`` arguments (``locals()``), naming the flag and the allowed values;
    with ``default_policy`` (``build_policy`` not overridden) and no policy, the MLP's sizes too."""
    policy = args["policy"]
    if isinstance(policy, str):  # hparams of a checkpoint whose policy was passed as an object
        name = policy.rsplit(".", 1)[-1]
        raise ValueError(
            f"this module's policy ({policy}) was passed as a Python object, so a checkpoint cannot "
            f"rebuild it: pass it again, e.g. load_from_checkpoint(path, policy={name}(...))"
        )
    if policy is not None and not isinstance(policy, nn.Module):
        raise TypeError(
            f"--model.policy must be an nn.Module (class_path + init_args), got {type(policy).__name__}"
        )
    if policy is not None and tuple(args["hidden_sizes"]) != (64, 64):
        raise ValueError(
            "--model.hidden_sizes sizes the default MLP policy and has no effect with --model.policy: "
            "set the injected policy's own sizes in --model.policy.init_args"
        )
    if args["ratio_granularity"] not in GRANULARITIES:
        raise ValueError(
            f"--model.ratio_granularity must be one of {' | '.join(GRANULARITIES)}, "
            f"got {args['ratio_granularity']!r}"
        )
    lows = {"max_nonfinite_updates": 0, "value_warmup_updates": 0, "update_epochs": 1, "num_minibatches": 1}
    for name, low in lows.items():
        if args[name] < low:
            raise ValueError(f"--model.{name} must be >= {low}, got {args[name]}")
    if args["tokens_per_action"] is not None and args["tokens_per_action"] < 1:
        raise ValueError(
            f"--model.tokens_per_action must be >= 1 or null (the tokens of one env action), "
            f"got {args['tokens_per_action']}"
        )
    for name in ("gamma", "gae_lambda"):
        if not 0.0 <= args[name] <= 1.0:
            raise ValueError(f"--model.{name} must be in [0, 1], got {args[name]}")
    if args["lr"] <= 0:
        raise ValueError(f"--model.lr must be > 0, got {args['lr']}")
    for name in ("value_clip_eps", "max_grad_norm"):
        if args[name] is not None and args[name] <= 0:
            raise ValueError(f"--model.{name} must be > 0 or null, got {args[name]}")
    if policy is None and default_policy and args.get("spaces"):
        check_spaces(args["spaces"])
    elif policy is None and default_policy:
        check_mlp_sizes(args["obs_dim"], args["action_dim"])


def check_spaces(spaces: dict[str, Any]) -> None:
    """The default policies take every part of the env's spaces (:func:`fastlight.models.spaces.refusal`)."""
    line = refusal(spaces)
    if line:
        raise ValueError(line)


def check_mlp_sizes(obs_dim: int, action_dim: int) -> None:
    """The default MLP policy needs both env sizes."""
    if obs_dim < 1 or action_dim < 1:
        raise ValueError(
            f"--model.obs_dim and --model.action_dim must be >= 1 (linked from the data module by "
            f"`fastlight fit`), got {obs_dim} and {action_dim}"
        )


def policy_not_built(module_type: type) -> str:
    """Why ``module.policy`` does not exist yet, and where to use it instead."""
    return (
        f"{module_type.__name__}.policy does not exist yet: it is built by configure_model(), "
        "which the Trainer calls at the start of fit/validate/predict (and load_from_checkpoint "
        "calls too), after __init__; use the policy in configure_model() after "
        "super().configure_model(), outside a Trainer call module.configure_model() first, or "
        "inject one (--model.policy, or policy=...)"
    )


def build_policy_hint(module_type: type, error: AttributeError) -> str:
    """One line (with the flag naming the class, for the CLI's one-line errors) saying what to do."""
    name, path = module_type.__name__, class_path(module_type)
    return (
        f"--model.class_path {path}: {name}.build_policy() raised AttributeError: {error}. "
        f"build_policy() runs in configure_model(), after __init__: set every attribute it reads in "
        f"{name}.__init__ (e.g. `super().__init__(**kwargs)` then `self.width = width`), or build the "
        f"policy elsewhere and pass it as --model.policy"
    )
