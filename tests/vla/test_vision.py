"""PatchEncoder: image conventions, token shapes, validation."""

from __future__ import annotations

import pytest
import torch

from fastlight.vla.vision import PatchEncoder


def test_uint8_channels_last_equals_float_channels_first() -> None:
    torch.manual_seed(0)
    enc = PatchEncoder(image_size=16, patch_size=4, channels=3, dim=8, out_dim=12)
    img = torch.randint(0, 256, (2, 16, 16, 3), dtype=torch.uint8)
    a = enc(img)
    b = enc(img.permute(0, 3, 1, 2).float() / 255.0)
    assert a.shape == (2, 16, 12) and enc.num_patches == 16
    assert enc.encode(img).shape == (2, 16, 8)
    assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize(
    "images",
    [
        torch.zeros(2, 16, 16, 4, dtype=torch.uint8),
        torch.zeros(2, 3, 16, 16, dtype=torch.uint8),
        torch.zeros(2, 16, 16, 3),
        torch.zeros(2, 3, 8, 8),
        torch.zeros(2, 3, 16, 16, dtype=torch.int32),
    ],
)
def test_wrong_images_raise(images: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="images must be"):
        PatchEncoder(image_size=16, patch_size=4)(images)


def test_bad_patch_size_raises() -> None:
    with pytest.raises(ValueError, match="patch_size"):
        PatchEncoder(image_size=16, patch_size=5)
