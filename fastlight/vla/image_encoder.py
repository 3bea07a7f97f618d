"""The image encoder of a :class:`~fastlight.vla.policy.VLAPolicy`, chosen by its backbone: a VLM's own
processor, tower and projector (:func:`~fastlight.vla.hf_vlm.image_features`), a
:class:`~fastlight.vla.vision.PatchEncoder` for a causal LM, or none (``image_size=None``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from fastlight.vla.hf_vlm import image_features, load_image_processor, projector, vision_tower
from fastlight.vla.vision import PatchEncoder


class ImageEncoder(NamedTuple):
    """What :func:`image_encoder` chose: at most one of ``vision`` / ``processor`` (the folder's image
    processor), and the backbone's submodules to freeze (a VLM's tower with ``freeze_vision``; tower and
    projector when unused)."""

    vision: PatchEncoder | None
    processor: Any
    frozen: list[nn.Module]


def image_encoder(
    backbone: nn.Module,
    path: str | None,
    is_vlm: bool,
    image_size: int | None,
    patch_size: int,
    hidden: int,
    freeze: bool,
    trust_remote_code: bool = False,
) -> ImageEncoder:
    """The encoder for ``image_size`` images (the env's side; ``None``: no images) into ``hidden``-wide
    tokens; ``path`` is the backbone folder (its image processor), ``patch_size`` the patch encoder's."""
    if image_size is not None and (isinstance(image_size, bool) or image_size < 1):
        raise ValueError(f"--model.policy.init_args.image_size must be >= 1 or null, got {image_size!r}")
    if is_vlm:
        tower, proj = vision_tower(backbone), projector(backbone)
        if image_size is None:  # unused: frozen, so that DDP finds no unused trainable parameters
            return ImageEncoder(None, None, [tower] + ([proj] if proj is not None else []))
        processor = load_image_processor(str(path), trust_remote_code)
        return ImageEncoder(None, processor, [tower] if freeze else [])
    if image_size is None:
        return ImageEncoder(None, None, [])
    return ImageEncoder(PatchEncoder(image_size, patch_size, 3, dim=hidden, out_dim=hidden), None, [])


def image_tokens(
    backbone: nn.Module, vision: PatchEncoder | None, processor: Any, image_size: int | None, images: Tensor
) -> tuple[Tensor, Tensor | None]:
    """Images -> tokens ``[N, P, H]`` (the VLM's processor, tower and projector, or the patch encoder) and
    the processor's ``image_grid_thw`` where it gives one (multimodal RoPE, else ``None``); a one-line
    ``ValueError`` for images of another shape than the env's or when the policy has no image encoder."""
    if processor is not None:
        s = image_size
        if images.dtype != torch.uint8 or images.dim() != 4 or tuple(images.shape[1:]) != (s, s, 3):
            raise ValueError(
                f"images must be uint8 [N, {s}, {s}, 3] (N, H, W, C) for the backbone's image processor, "
                f"got {tuple(images.shape)} {images.dtype}"
            )
        tokens, inputs = image_features(backbone, processor, images)
        return tokens, inputs.get("image_grid_thw")
    if vision is not None:
        return vision(images), None
    raise ValueError(
        f"obs has 'image' {tuple(images.shape)} but the policy has no image encoder "
        "(--model.policy.init_args.image_size=null): set --model.policy.init_args.image_size to the "
        "env's image side"
    )
