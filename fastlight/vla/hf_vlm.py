"""Hugging Face models from a local folder as :class:`~fastlight.vla.policy.VLAPolicy` backbones: loading
(:func:`load_backbone`), the vision tower and projector (:func:`image_features`, :func:`position_ids`), the
folder's tokenizer and image processor, and a random Llama (:func:`build_llama`).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fastlight.extras import import_extra
from fastlight.vla.pruning import load_pruned_model
from fastlight.vla.transformers_compat import no_split_classes, reset_output_capture

#: The CLI flag that names a backbone folder (error messages).
BACKBONE_FLAG = "--model.policy.init_args.backbone"

#: Attribute names of a VLM's vision tower inside ``model.model`` (Llava / PaliGemma, Idefics3, Qwen2-VL).
VISION_TOWER_NAMES = ("vision_tower", "vision_model", "visual")
#: Attribute names of the projector from the tower to the language model (Llava / PaliGemma, Idefics3).
PROJECTOR_NAMES = ("multi_modal_projector", "connector")
#: The setting that lets a folder's own code run (error messages).
TRUST_FLAG = "--model.policy.init_args.trust_remote_code"
#: The auto classes whose entry in a folder's ``auto_map`` names the model class to load, by preference:
#: the first two a VLM (``AutoModelForVision2Seq``, OpenVLA's, is the first's older name), the last an LM.
REMOTE_AUTO_CLASSES = ("AutoModelForImageTextToText", "AutoModelForVision2Seq", "AutoModelForCausalLM")


def _transformers() -> Any:
    return import_extra("transformers", extra="vla", what="the VLA policy")


def build_llama(
    vocab_size: int,
    hidden_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    intermediate_size: int,
    tie_word_embeddings: bool = False,
) -> nn.Module:
    """A randomly initialised ``LlamaForCausalLM`` from a ``LlamaConfig`` (nothing downloaded)."""
    transformers = _transformers()
    if hidden_size % num_attention_heads:
        raise ValueError(
            "hidden_size must be divisible by num_attention_heads, "
            f"got {hidden_size} and {num_attention_heads}"
        )
    cfg = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        tie_word_embeddings=tie_word_embeddings,
    )
    return transformers.LlamaForCausalLM(cfg)


def load_backbone(path: str, trust_remote_code: bool = False) -> tuple[nn.Module, bool]:
    """``(model, is_vlm)`` of the local folder ``path``: a VLM (``AutoModelForImageTextToText``) or a causal
    LM (``AutoModelForCausalLM``), pruned folders included; a folder with its own code (``auto_map``), only
    with ``trust_remote_code``, as the class of its first :data:`REMOTE_AUTO_CLASSES` entry. Anything else
    raises a one-line ``ValueError`` naming ``path`` (never transformers' interactive prompt: a run without
    a terminal must not hang). A VLM's decoder is made causal (action slots must not see later slots)."""
    transformers = _transformers()
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{BACKBONE_FLAG} {path}: not a local model folder (no config.json there)")
    auto_map = json.loads((folder / "config.json").read_text()).get("auto_map") or {}
    if auto_map and not trust_remote_code:
        raise ValueError(
            f"{BACKBONE_FLAG} {path}: its config.json maps in its own code ({', '.join(sorted(auto_map))}); "
            f"set {TRUST_FLAG} true to run it, or use a folder of a transformers architecture"
        )
    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    if config.model_type in ("pi0", "pi05"):  # flow matching: no action tokens to prune
        raise ValueError(
            f"{BACKBONE_FLAG} {path}: a {config.model_type} folder (flow matching) loads with "
            "--model.policy.class_path fastlight.vla.flow_policy.FlowVLAPolicy, not VLAPolicy"
        )
    text = config.get_text_config()
    if getattr(text, "use_bidirectional_attention", False):  # PaliGemma's prefix attention
        text.use_bidirectional_attention = False
    remote = next((n for n in REMOTE_AUTO_CLASSES if n in auto_map), None)
    if remote is not None:  # the class itself: the auto class of its entry may be gone from transformers
        get_class = transformers.dynamic_module_utils.get_class_from_dynamic_module
        model = load_pruned_model(folder, get_class(auto_map[remote], str(folder)), config=config)
        return model, remote != "AutoModelForCausalLM"
    if type(config) in transformers.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING:
        return load_pruned_model(folder, transformers.AutoModelForImageTextToText, config=config), True
    if type(config) in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        return load_pruned_model(folder, transformers.AutoModelForCausalLM, config=config), False
    raise ValueError(
        f"{BACKBONE_FLAG} {path}: its config is a {type(config).__name__}, neither a vision-language model "
        "(AutoModelForImageTextToText) nor a causal language model (AutoModelForCausalLM)"
    )


def _inner(model: nn.Module) -> nn.Module:
    """The VLM's inner model (``model.model``) that holds tower, projector and language model."""
    inner = getattr(model, "model", None)
    return inner if isinstance(inner, nn.Module) else model


def vision_tower(model: nn.Module) -> nn.Module:
    """The VLM's vision tower (see :data:`VISION_TOWER_NAMES`); ``ValueError`` if it has none."""
    return _child(model, VISION_TOWER_NAMES, "vision tower")


def projector(model: nn.Module) -> nn.Module | None:
    """The VLM's projector (:data:`PROJECTOR_NAMES`); ``None`` where the tower holds it (Qwen2-VL)."""
    return _child(model, PROJECTOR_NAMES, None)


def _child(model: nn.Module, names: Sequence[str], what: str | None) -> nn.Module | None:
    """The first of ``names`` that is a submodule of the VLM's inner model; none: ``ValueError`` naming
    ``what`` (``None``: return ``None``)."""
    inner = _inner(model)
    child = next((getattr(inner, n) for n in names if isinstance(getattr(inner, n, None), nn.Module)), None)
    if child is None and what is not None:
        raise ValueError(f"{type(model).__name__} has no {what} (looked for {', '.join(names)})")
    return child


def image_features(model: nn.Module, processor: Any, images: Tensor) -> tuple[Tensor, Any]:
    """The VLM's image tokens ``[N, P, hidden]`` of ``images`` uint8 ``[N, H, W, 3]``, and the image
    processor's output they came from (the folder's processor, then the model's own ``get_image_features``
    with every tensor of that output it names; per-sample outputs are stacked)."""
    if getattr(processor, "backend", None) != "torchvision":
        images = images.cpu()  # the PIL backend works on numpy arrays
    inputs = processor(images=[[im] for im in images], return_tensors="pt", input_data_format="channels_last")
    weight = next(vision_tower(model).parameters())
    named = inspect.signature(model.get_image_features).parameters
    kwargs = {
        k: v.to(weight.device, weight.dtype if v.is_floating_point() else v.dtype)
        for k, v in inputs.items()
        if k in named and isinstance(v, Tensor)
    }
    out = model.get_image_features(**kwargs)
    feats = getattr(out, "pooler_output", out)
    if isinstance(feats, (list, tuple)):
        feats = torch.stack([f.reshape(-1, f.shape[-1]) for f in feats])
    if feats.dim() != 3 or feats.shape[0] != images.shape[0]:
        raise ValueError(
            f"{type(model).__name__}.get_image_features gave {tuple(feats.shape)} for "
            f"{images.shape[0]} images; expected [N, tokens, hidden]"
        )
    return feats, inputs


def position_ids(model: nn.Module, mask: Tensor, image_tokens: int, image_grid_thw: Tensor | None) -> Tensor:
    """Position ids of a prefix whose first ``image_tokens`` positions hold one image per row (``mask``
    ``[N, S]``, 0 = padding, skipped): ``[N, S]``; or, for a model with multimodal RoPE (its own
    ``get_rope_index``, Qwen2-VL / Qwen2.5-VL) and an image, ``[3, N, S]`` as the model's own forward
    computes them: the image's tokens at their (time, row, column) of ``image_grid_thw``, text after."""
    get_rope_index = getattr(_inner(model), "get_rope_index", None)
    if image_grid_thw is None or get_rope_index is None:
        return (mask.cumsum(dim=1) - 1).clamp(min=0)
    types = torch.zeros_like(mask, dtype=torch.int)
    types[:, :image_tokens] = 1
    grid = image_grid_thw.to(mask.device)
    return get_rope_index(torch.zeros_like(mask), types, image_grid_thw=grid, attention_mask=mask)[0]


class PicklableCapture(nn.Module):
    """Base of a module that holds transformers models and travels to other processes: pickled or copied
    at any time without transformers' capture hooks (:mod:`fastlight.vla.transformers_compat`)."""

    def block_classes(self) -> set[type[nn.Module]]:
        """FSDP2's units (:class:`~fastlight.models.base.ShardsBlocks`): its ``_no_split_modules`` classes."""
        return no_split_classes(self)

    def __getstate__(self) -> dict:
        reset_output_capture(self)  # the hooks are local closures; transformers re-installs them on use
        return super().__getstate__()

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        reset_output_capture(self)


def has_tokenizer(path: str | None) -> bool:
    """True when the folder holds a tokenizer (``tokenizer.json`` or ``tokenizer_config.json``)."""
    names = ("tokenizer.json", "tokenizer_config.json")
    return path is not None and any((Path(path) / name).is_file() for name in names)


def load_tokenizer(path: str) -> Any:
    """The folder's own tokenizer (``AutoTokenizer``; code of the folder's is never run)."""
    return _transformers().AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def load_image_processor(path: str, trust_remote_code: bool = False) -> Any:
    """The folder's own image processor (``AutoImageProcessor``): its torchvision backend where
    torchvision is installed (batched, on the images' device), else its PIL one (on the CPU)."""
    return _transformers().AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
