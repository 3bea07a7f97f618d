"""``--model.init_from``: start a run from another run's policy weights (SFT -> RL, RL -> RL).

VLA RL starts from a policy fine-tuned on demonstrations (AcceRL §experiments). Only the policy's weights
(``policy.*``) are taken, not the optimizer or counters; ``--ckpt_path`` is the way to *resume*. Every
tensor of this run's policy must be in the checkpoint with the same shape, except the value parameters
of a policy that keeps them apart (:class:`HasValueParameters`), left at their initialisation when absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from fastlight.checkpoints import read_checkpoint


@runtime_checkable
class HasValueParameters(Protocol):
    def value_parameters(self) -> list[nn.Parameter]: ...


def _value_keys(policy: nn.Module) -> set[str]:
    if not isinstance(policy, HasValueParameters):
        return set()
    ids = {id(p) for p in policy.value_parameters()}
    return {name for name, p in policy.named_parameters() if id(p) in ids}


def load_policy_weights(policy: nn.Module, path: str | Path, *, flag: str = "--model.init_from") -> dict:
    """Copy the ``policy.*`` tensors of checkpoint ``path`` into ``policy``, after checking them all.

    Returns ``{"tensors": n loaded, "value_loaded": bool}``. Raises ``FileNotFoundError`` /
    ``ValueError`` naming ``flag``, the file and the mismatch; nothing is copied unless all match.
    """
    ckpt = read_checkpoint(path, flag=flag)
    theirs = {k[len("policy.") :]: v for k, v in ckpt["state_dict"].items() if k.startswith("policy.")}
    if not theirs:
        raise ValueError(f"{flag}: {path} holds no policy weights (no 'policy.*' tensors in its state_dict)")
    mine = policy.state_dict()
    optional = _value_keys(policy)
    problems = [
        f"{k}: checkpoint {list(theirs[k].shape)} vs this model {list(v.shape)}"
        for k, v in mine.items()
        if k in theirs and theirs[k].shape != v.shape
    ]
    missing = [k for k in mine if k not in theirs and k not in optional]
    unexpected = [k for k in theirs if k not in mine]
    if missing:
        problems.append(f"missing from the checkpoint: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        problems.append(f"not in this model: {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
    if problems:
        raise ValueError(
            f"{flag}: {path} does not fit this policy (vocab, bins, action tokens, hidden size and "
            f"layers must match the run that saved it): " + "; ".join(problems)
        )
    policy.load_state_dict(theirs, strict=False)
    # without value parameters of its own (an MLP), every tensor was required, the value head's too
    return {"tensors": len(theirs), "value_loaded": optional <= theirs.keys()}


def init_policy_from(policy: nn.Module, path: str | Path) -> None:
    """``--model.init_from``: :func:`load_policy_weights`, then one line (rank zero) saying what loaded."""
    info = load_policy_weights(policy, path)
    rank_zero_info(
        f"fastlight: policy initialised from {path} ({info['tensors']} tensors"
        + ("" if info["value_loaded"] else "; value head left at its initialisation")
        + ")"
    )
