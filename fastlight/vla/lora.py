"""LoRA adapters on a VLA backbone's language model, through ``peft``.

LoRA (Hu et al., 2022, "LoRA: Low-Rank Adaptation of Large Language Models") freezes a pretrained
weight ``W`` and trains a rank-``r`` update ``(alpha / r) * B A`` beside it. :func:`apply_lora` injects
adapters into the backbone's **language model** (``backbone.get_decoder()``) with peft's
``inject_adapter_in_model`` (no ``PeftModel`` wrapper: the policy's forward passes do not change).
Everything outside the language model keeps its ``requires_grad``: the (pruned) ``lm_head``, the
policy's own modules, a VLM's projector and vision tower (as ``freeze_vision`` left it). A checkpoint
holds ``<layer>.base_layer.weight`` and ``lora_A`` / ``lora_B``: it loads into a policy built with the
same ``lora`` settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from torch import nn

from fastlight.extras import import_extra

#: The flag the settings live under (errors name it).
FLAG = "--model.policy.init_args.lora"
#: Llama / Gemma / Qwen names of the attention and MLP projections (peft matches name suffixes).
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoRASettings:
    """LoRA on the backbone's language model.

    Args:
        r: rank of each adapter (``>= 1``).
        alpha: scale numerator: the update is ``(alpha / r) * B A`` (``> 0``).
        target_modules: names of the linear layers to adapt inside the language model (peft's suffix match).
        dropout: dropout on the adapters' input, in ``[0, 1)``.
    """

    r: int = 16
    alpha: float = 32.0
    target_modules: tuple[str, ...] = DEFAULT_TARGETS
    dropout: float = 0.0

    def __post_init__(self) -> None:
        targets = self.target_modules
        if isinstance(targets, str) or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(
                f"{FLAG}.target_modules must be a list of layer names (e.g. [q_proj, v_proj]), "
                f"got {targets!r}"
            )
        object.__setattr__(self, "target_modules", tuple(targets))
        if not self.target_modules:
            raise ValueError(f"{FLAG}.target_modules must name at least one layer (e.g. [q_proj, v_proj])")
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"{FLAG}.r must be an integer >= 1, got {self.r!r}")
        if not self.alpha > 0:
            raise ValueError(f"{FLAG}.alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{FLAG}.dropout must be in [0, 1), got {self.dropout!r}")


def as_lora_settings(value: LoRASettings | Mapping[str, Any] | None) -> LoRASettings | None:
    """``value`` as :class:`LoRASettings` (a mapping is checked key by key); ``None`` stays None."""
    if value is None or isinstance(value, LoRASettings):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{FLAG} must be a mapping of r, alpha, target_modules, dropout (or null), got {value!r}"
        )
    allowed = [f.name for f in fields(LoRASettings)]
    unknown = [k for k in value if k not in allowed]
    if unknown:
        raise ValueError(f"{FLAG}.{unknown[0]} is not a LoRA setting; allowed: {', '.join(allowed)}")
    return LoRASettings(**value)


def apply_lora(backbone: nn.Module, settings: LoRASettings) -> int:
    """Inject ``settings``' adapters into ``backbone``'s language model, in place, freezing its other
    weights; the output head keeps (or regains, when tied to frozen embeddings) ``requires_grad``.
    Returns the number of adapted layers. Raises ``ValueError`` naming ``target_modules`` when no
    layer matches, and :class:`~fastlight.extras.MissingExtraError` without peft."""
    peft = import_extra("peft", extra="vla", what=f"LoRA ({FLAG})")
    get_decoder = getattr(backbone, "get_decoder", None)
    lm = get_decoder() if callable(get_decoder) else backbone
    s = settings
    config = peft.LoraConfig(
        r=s.r, lora_alpha=s.alpha, target_modules=list(s.target_modules), lora_dropout=s.dropout, bias="none"
    )
    try:
        peft.inject_adapter_in_model(config, lm)
    except ValueError as e:
        if "not found in the base model" not in str(e):
            raise
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in lm.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(
            f"{FLAG}.target_modules={list(settings.target_modules)} matches no layer of the backbone's "
            f"language model ({type(lm).__name__}); its linear layers are named {linear}"
        ) from None
    head = backbone.get_output_embeddings() if hasattr(backbone, "get_output_embeddings") else None
    if head is not None:
        head.requires_grad_(True)
    return sum(1 for m in lm.modules() if isinstance(m, peft.tuners.lora.LoraLayer))
