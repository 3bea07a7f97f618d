"""``NatureCNN``: the convolutional encoder of image observations (Mnih et al. 2015, the network of
cleanrl's Atari PPO and Stable-Baselines3's ``NatureCNN``).

Pixels arrive as the env gives them (uint8 ``[N, H, W, C]`` or ``[N, C, H, W]``) and are scaled to
``[0, 1]`` here, so rollouts keep the compact uint8.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

#: Channel counts an image observation may have: grey, RGB, RGBA or a stack of 4 grey frames (as SB3).
IMAGE_CHANNELS = (1, 3, 4)
#: The smallest height and width the three convolutions leave at least one pixel of.
MIN_IMAGE_SIDE = 36


def channels_first(shape: tuple[int, ...]) -> bool:
    """Whether an image ``shape`` (3 dims) is ``C, H, W``: its first dim is the smallest (SB3's rule),
    so ``(3, 64, 64)`` and ``(4, 84, 84)`` are channels-first and ``(64, 64, 3)`` channels-last."""
    return shape[0] == min(shape) and shape[0] in IMAGE_CHANNELS


def _layer(layer: nn.Conv2d | nn.Linear) -> nn.Module:
    # Orthogonal init with gain sqrt(2) before ReLU: cleanrl's layer_init for this network.
    nn.init.orthogonal_(layer.weight, gain=math.sqrt(2))
    nn.init.zeros_(layer.bias)
    return layer


class NatureCNN(nn.Module):
    """uint8 images ``[N, *shape]`` (``shape``: ``H, W, C`` or ``C, H, W``, see :func:`channels_first`)
    -> features ``[N, features]``."""

    def __init__(self, shape: tuple[int, ...], features: int = 512) -> None:
        super().__init__()
        self.shape = tuple(int(s) for s in shape)
        self.chw = channels_first(self.shape)
        c, h, w = self.shape if self.chw else (self.shape[2], self.shape[0], self.shape[1])
        self.convs = nn.Sequential(
            _layer(nn.Conv2d(c, 32, 8, stride=4)), nn.ReLU(),
            _layer(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            _layer(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, c, h, w)).shape[1]
        self.linear = nn.Sequential(_layer(nn.Linear(flat, features)), nn.ReLU())
        self.features = features

    def forward(self, images: Tensor) -> Tensor:
        x = images.reshape(images.shape[0], *self.shape).float() / 255.0
        if not self.chw:
            x = x.permute(0, 3, 1, 2)
        return self.linear(self.convs(x))
