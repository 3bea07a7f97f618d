"""Prune a causal LM's ``lm_head`` to the action-token rows (AcceRL §lm_head pruning).

The ``[N_vocab, d_model]`` output layer becomes ``[N_actions, d_model]``: gradients and optimizer state
of the head shrink by ``N_vocab / N_actions`` and no probability mass leaks to text tokens; logit ``j``
of the pruned head equals logit ``first_id + j`` of the original. A pruned model records
``config.action_token_range = [first_id, last_id]`` (``config.vocab_size`` still sizes the input
embeddings); a saved pruned folder loads with :func:`load_pruned_model` (``from_pretrained`` fails).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fastlight.extras import import_extra

#: Config attribute recording the pruned range ``[first_id, last_id)``.
PRUNED_RANGE_ATTR = "action_token_range"


def _configs(model: nn.Module) -> list:
    """The model's config and (for composite models) its text config, without duplicates."""
    cfg = getattr(model, "config", None)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return [] if cfg is None else [cfg] if text is cfg else [cfg, text]


def _untie(model: nn.Module) -> None:
    """Stop tying the output head to the input embeddings (config flag + HF's tie mapping)."""
    for cfg in _configs(model):
        cfg.tie_word_embeddings = False
    if hasattr(model, "all_tied_weights_keys") and hasattr(model, "get_expanded_tied_weights_keys"):
        model.all_tied_weights_keys = model.get_expanded_tied_weights_keys(all_submodels=True)


def prune_lm_head(model: nn.Module, first_id: int, last_id: int) -> nn.Linear:
    """Replace ``model``'s output head by its rows ``[first_id, last_id)``, in place (AcceRL).

    Shapes: ``weight [V, d_model]`` (``bias [V]``) -> ``[N, d_model]`` (``[N]``), ``N = last_id - first_id``,
    clones on the old head's device and dtype. A head tied to the input embeddings is untied first
    (``config.tie_word_embeddings = False``); the input embedding keeps its full ``[V, d_model]`` weight.
    Raises ``ValueError`` for a model without a ``Linear`` output head, a model already pruned, or ids
    outside ``0 <= first_id < last_id <= V``.
    """
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(f"prune_lm_head needs an nn.Linear output head, got {type(head).__name__}")
    if pruned_range(model) is not None:
        raise ValueError(f"model is already pruned to {PRUNED_RANGE_ATTR}={pruned_range(model)}")
    vocab = head.out_features
    if not (0 <= first_id < last_id <= vocab):
        raise ValueError(
            f"action ids must satisfy 0 <= first_id < last_id <= {vocab} (head rows), "
            f"got first_id={first_id}, last_id={last_id}"
        )
    _untie(model)
    weight = head.weight
    # skip_init: no random init (it would be overwritten, and it would consume the global RNG).
    new_head = nn.utils.skip_init(
        nn.Linear, head.in_features, last_id - first_id, bias=head.bias is not None,
        device=weight.device, dtype=weight.dtype,
    )  # fmt: skip
    with torch.no_grad():  # a frozen head stays frozen, bias included
        new_head.weight.copy_(weight[first_id:last_id]).requires_grad_(weight.requires_grad)
        if head.bias is not None:
            new_head.bias.copy_(head.bias[first_id:last_id]).requires_grad_(head.bias.requires_grad)
    model.set_output_embeddings(new_head)
    for cfg in _configs(model):
        setattr(cfg, PRUNED_RANGE_ATTR, [int(first_id), int(last_id)])
    return new_head


def pruned_range(model: nn.Module) -> tuple[int, int] | None:
    """The ``(first_id, last_id)`` a model was pruned to, or ``None`` if it is not pruned."""
    for cfg in _configs(model):
        rng = getattr(cfg, PRUNED_RANGE_ATTR, None)
        if rng is not None:
            return int(rng[0]), int(rng[1])
    return None


def _param_name(model: nn.Module, param: nn.Parameter) -> str:
    for name, p in model.named_parameters(remove_duplicate=False):
        if p is param:
            return name
    raise ValueError("output head weight is not a registered parameter of the model")


def _read_tensor(folder: Path, key: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Read the parameter ``key`` from a (possibly sharded) safetensors checkpoint folder, or (saved under
    another name, e.g. Llava's ``language_model.lm_head.weight``) the one tensor whose name ends with the
    same module and parameter name and that has ``shape``."""
    safe_open = import_extra("safetensors", extra="vla", what="loading a pruned VLA checkpoint").safe_open

    index = folder / "model.safetensors.index.json"
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else None
    suffix, found = "." + ".".join(key.split(".")[-2:]), []
    for shard in shards or ["model.safetensors"]:
        with safe_open(str(folder / shard), framework="pt") as f:
            if key in f.keys():
                return f.get_tensor(key)
            fits = lambda k: shape is None or tuple(f.get_slice(k).get_shape()) == shape  # noqa: E731
            found += [f.get_tensor(k) for k in f.keys() if ("." + k).endswith(suffix) and fits(k)]
    if len(found) != 1:
        raise ValueError(
            f"checkpoint {folder} has no tensor {key!r} (nor one ending {suffix[1:]!r} of {shape})"
        )
    return found[0]


def load_pruned_causal_lm(path: str, **kwargs) -> nn.Module:
    """:func:`load_pruned_model` with ``AutoModelForCausalLM``; ``kwargs`` go to ``from_pretrained``."""
    transformers = import_extra("transformers", extra="vla", what="loading a pretrained causal LM")
    return load_pruned_model(path, transformers.AutoModelForCausalLM, **kwargs)


def load_pruned_model(path: str | Path, auto_class: Any, config: Any = None, **kwargs) -> nn.Module:
    """Load a model saved after :func:`prune_lm_head` (or an unpruned one) from a local folder with
    ``auto_class`` (``AutoModelForCausalLM``, ``AutoModelForImageTextToText``, ...): a pruned folder loads
    with ``ignore_mismatched_sizes=True``, is pruned to the recorded range and gets the saved head copied
    in (safetensors only). ``config``: the folder's config, possibly edited (``None``: read from the
    folder); ``kwargs`` go to ``from_pretrained``."""
    transformers = import_extra("transformers", extra="vla", what="loading a pretrained model")
    folder = Path(path)
    config = transformers.AutoConfig.from_pretrained(folder) if config is None else config
    cfgs = [config, config.get_text_config() if hasattr(config, "get_text_config") else config]
    rng = next((getattr(c, PRUNED_RANGE_ATTR) for c in cfgs if getattr(c, PRUNED_RANGE_ATTR, None)), None)
    if rng is None:
        return auto_class.from_pretrained(folder, config=config, **kwargs)
    for c in cfgs:
        if hasattr(c, PRUNED_RANGE_ATTR):
            delattr(c, PRUNED_RANGE_ATTR)
    model = auto_class.from_pretrained(folder, config=config, ignore_mismatched_sizes=True, **kwargs)
    keys = {k: _param_name(model, p) for k, p in model.get_output_embeddings().named_parameters()}
    head = prune_lm_head(model, int(rng[0]), int(rng[1]))
    with torch.no_grad():
        for k, p in head.named_parameters():
            p.copy_(_read_tensor(folder, keys[k], tuple(p.shape)))
    return model
