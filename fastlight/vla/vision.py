"""A small patch encoder that turns camera images into prefix tokens for the VLA's language model.

A stand-in for a VLA's vision tower (OpenVLA-OFT's, fine-tuned by AcceRL, is a pretrained ViT and a
projector) for a backbone without one.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PatchEncoder(nn.Module):
    """Conv patchify + position embedding + projector: images -> ``[N, P, out_dim]`` tokens.

    Args:
        image_size: side of the square input image, a multiple of ``patch_size``.
        patch_size: side of one square patch.
        channels: image channels ``C``.
        dim: width of the patch tokens.
        out_dim: language-model hidden size the projector maps to (``None``: ``dim``).
    """

    def __init__(
        self,
        image_size: int = 64,
        patch_size: int = 8,
        channels: int = 3,
        dim: int = 64,
        out_dim: int | None = None,
    ) -> None:
        super().__init__()
        if patch_size < 1 or image_size < patch_size or image_size % patch_size:
            raise ValueError(
                f"image_size must be a positive multiple of patch_size, got image_size={image_size}, "
                f"patch_size={patch_size}"
            )
        if channels < 1 or dim < 1:
            raise ValueError(f"channels and dim must be >= 1, got channels={channels}, dim={dim}")
        self.image_size, self.patch_size, self.channels = image_size, patch_size, channels
        self.num_patches = (image_size // patch_size) ** 2
        self.patchify = nn.Conv2d(channels, dim, kernel_size=patch_size, stride=patch_size)
        self.pos_embedding = nn.Parameter(torch.randn(1, self.num_patches, dim) * 0.02)
        self.projector = nn.Linear(dim, out_dim if out_dim is not None else dim)

    def normalise(self, images: Tensor) -> Tensor:
        """``uint8 [N, H, W, C]`` (0..255) or floating ``[N, C, H, W]`` in ``[0, 1]`` -> float
        ``[N, C, H, W]`` in ``[-1, 1]``."""
        s, c = self.image_size, self.channels
        if images.dtype == torch.uint8:
            if images.dim() != 4 or tuple(images.shape[1:]) != (s, s, c):
                raise ValueError(
                    f"uint8 images must be [N, {s}, {s}, {c}] (N, H, W, C), got {tuple(images.shape)}"
                )
            x = images.permute(0, 3, 1, 2).float() / 255.0
        elif images.is_floating_point():
            if images.dim() != 4 or tuple(images.shape[1:]) != (c, s, s):
                raise ValueError(
                    f"float images must be [N, {c}, {s}, {s}] (N, C, H, W), got {tuple(images.shape)}"
                )
            x = images
        else:
            raise ValueError(
                f"images must be uint8 [N, H, W, C] or float [N, C, H, W], got dtype {images.dtype}"
            )
        return (x * 2.0 - 1.0).to(self.patchify.weight.dtype)

    def encode(self, images: Tensor) -> Tensor:
        """Images (see :meth:`normalise`) -> patch tokens ``[N, P, dim]`` (before the projector)."""
        x = self.patchify(self.normalise(images))  # [N, dim, S/p, S/p]
        return x.flatten(2).transpose(1, 2) + self.pos_embedding

    def forward(self, images: Tensor) -> Tensor:
        """Images -> projected tokens ``[N, P, out_dim]``, ``P = (image_size / patch_size)^2``."""
        return self.projector(self.encode(images))
