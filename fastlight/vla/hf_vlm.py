"""Hugging Face models from a local folder as :class:`~fastlight.vla.policy.VLAPolicy` backbones: loading,
the vision tower and projector, the folder's tokenizer and image processor, and a random Llama.

Loading (:func:`load_backbone`). A folder whose config maps in ``AutoModelForImageTextToText`` (Llava,
PaliGemma, Idefics3, ...) loads as a vision-language model (VLM), one whose config maps in
``AutoModelForCausalLM`` as a language model (pruned folders through
:func:`~fastlight.vla.pruning.load_pruned_model`); anything else is refused in one line naming the
folder and its config class. A VLM's decoder is made causal (PaliGemma's text config asks for
bidirectional attention over its prefix; the policy's action slots must not see later slots).
Without a folder, :func:`build_llama` builds a random ``LlamaForCausalLM``.

Images: :mod:`fastlight.vla.image_preprocessing` prepares them as the folder's image processor does,
then :func:`image_features` runs the model's own ``get_image_features`` (vision tower + projector) and
returns ``[N, P, hidden]``. Instructions: :mod:`fastlight.vla.retokenize` re-tokenizes the env's with
the folder's tokenizer (:func:`load_tokenizer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fastlight.extras import import_extra
from fastlight.vla.pruning import load_pruned_model

#: The CLI flag that names a backbone folder (error messages).
BACKBONE_FLAG = "--model.policy.init_args.backbone"

#: Attribute names of a VLM's vision tower inside ``model.model`` (Llava / PaliGemma, Idefics3, Qwen2-VL).
VISION_TOWER_NAMES = ("vision_tower", "vision_model", "visual")
#: Attribute names of the projector from the tower to the language model (Llava / PaliGemma, Idefics3).
PROJECTOR_NAMES = ("multi_modal_projector", "connector")
#: Model types whose ``get_image_features`` takes ``pixel_values [N, images, 3, h, w]``.
_IMAGES_PER_SAMPLE_TYPES = frozenset({"idefics2", "idefics3", "smolvlm"})

#: The transformers module whose forward hooks capture hidden states (see :func:`reset_output_capture`).
_CAPTURE = "transformers.utils.output_capturing"


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
    LlamaConfig, LlamaForCausalLM = transformers.LlamaConfig, transformers.LlamaForCausalLM

    if hidden_size % num_attention_heads:
        raise ValueError(
            "hidden_size must be divisible by num_attention_heads, "
            f"got {hidden_size} and {num_attention_heads}"
        )
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        tie_word_embeddings=tie_word_embeddings,
    )
    return LlamaForCausalLM(cfg)


def is_vision_language(config: Any) -> bool:
    """True when ``config``'s class maps in ``AutoModelForImageTextToText`` (a VLM)."""
    return type(config) in _transformers().AutoModelForImageTextToText._model_mapping


def load_backbone(path: str) -> tuple[nn.Module, bool]:
    """``(model, is_vlm)`` of the local folder ``path``: a VLM through ``AutoModelForImageTextToText``,
    else a causal LM through ``AutoModelForCausalLM`` (pruned folders included). Raises a one-line
    ``ValueError`` naming ``path`` for a missing folder or a config that is neither."""
    transformers = _transformers()
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{BACKBONE_FLAG} {path}: not a local model folder (no config.json there)")
    config = transformers.AutoConfig.from_pretrained(folder)
    if is_vision_language(config):
        text = config.get_text_config()
        if getattr(text, "use_bidirectional_attention", False):
            # Action slot k must not attend to slot k + 1 (autoregressive decoding feeds a_k there).
            text.use_bidirectional_attention = False
        return load_pruned_model(folder, transformers.AutoModelForImageTextToText, config=config), True
    if type(config) in transformers.AutoModelForCausalLM._model_mapping:
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
    """The VLM's projector from the tower to the language model (see :data:`PROJECTOR_NAMES`), or
    ``None`` where the architecture keeps it inside the tower (Qwen2-VL's merger)."""
    inner = _inner(model)
    return next(
        (getattr(inner, n) for n in PROJECTOR_NAMES if isinstance(getattr(inner, n, None), nn.Module)), None
    )


def _child(model: nn.Module, names: Sequence[str], what: str) -> nn.Module:
    inner = _inner(model)
    for name in names:
        child = getattr(inner, name, None)
        if isinstance(child, nn.Module):
            return child
    raise ValueError(f"{type(model).__name__} has no {what} (looked for {', '.join(names)})")


def image_features(model: nn.Module, pixel_values: Tensor) -> Tensor:
    """The VLM's image tokens: ``pixel_values [N, 3, h, w]`` -> ``[N, P, hidden]`` (vision tower,
    feature selection and projector, as the model's own ``get_image_features`` runs them)."""
    tower = vision_tower(model)
    dtype = next(tower.parameters()).dtype
    pixels = pixel_values.to(dtype)
    if model.config.model_type in _IMAGES_PER_SAMPLE_TYPES:
        pixels = pixels.unsqueeze(1)  # one image per sample
    out = model.get_image_features(pixel_values=pixels)
    feats = getattr(out, "pooler_output", out)
    if isinstance(feats, (list, tuple)):
        feats = torch.stack([f.reshape(-1, f.shape[-1]) for f in feats])
    if feats.dim() != 3 or feats.shape[0] != pixel_values.shape[0]:
        raise ValueError(
            f"{type(model).__name__}.get_image_features gave {tuple(feats.shape)} for "
            f"{pixel_values.shape[0]} images; expected [N, tokens, hidden]"
        )
    return feats


def reset_output_capture(module: nn.Module) -> None:
    """Make the transformers models inside ``module`` (a copy or an unpickled one) capture hidden
    states again, and picklable.

    transformers collects a model's hidden states (Llava's ``vision_feature_layer``) through forward
    hooks it installs on first use, and finds what a model class records in a process-wide registry
    filled when a model is constructed. An unpickled model (a spawned sampler's) was never constructed
    in its process: without re-registering, it silently records nothing. A copied one carries the
    hooks, local closures that pickle refuses: they are dropped here, and re-installed on next use.
    """
    try:
        from transformers.modeling_utils import PreTrainedModel
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # a transformers without this machinery needs nothing
        return
    for m in module.modules():
        keys = [k for k, fn in m._forward_hooks.items() if getattr(fn, "__module__", "") == _CAPTURE]
        for hooks in (m._forward_hooks, m._forward_hooks_with_kwargs, m._forward_hooks_always_called):
            for key in keys:
                hooks.pop(key, None)
        if isinstance(m, PreTrainedModel):
            m._output_capturing_hooks_installed = False
            _CAN_RECORD_REGISTRY[m] = m._can_record_outputs


def has_tokenizer(path: str | None) -> bool:
    """True when the folder holds a tokenizer (``tokenizer.json`` or ``tokenizer_config.json``)."""
    if path is None:
        return False
    folder = Path(path)
    return (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()


def load_tokenizer(path: str) -> Any:
    """The folder's own tokenizer (``AutoTokenizer``)."""
    return _transformers().AutoTokenizer.from_pretrained(path)


def load_image_processor(path: str) -> Any:
    """The folder's image processor, PIL backend (the reference
    :class:`~fastlight.vla.image_preprocessing.ImagePreprocessor` matches)."""
    return _transformers().AutoImageProcessor.from_pretrained(path, backend="pil")
