"""A vision-language model's image processor as batched torch ops, exact to its Pillow pipeline.

The settings of the image processor saved in a model folder (size, centre crop, resample filter,
rescale factor, mean / std) are applied with torch to the whole batch: uint8 ``[N, H, W, 3]`` -> float
``[N, 3, h, w]``. Resizing reproduces Pillow's resampling (the PIL backend of transformers' image
processors) exactly: Pillow resizes 8-bit images in two separable passes (width, then height) with
fixed-point filter weights (22 fractional bits) and rounds to uint8 after each pass;
:func:`pil_resize_weights` builds those integer weights as a matrix per axis, and a pass is one float64
matmul (exact: ``255 x 2^22 x`` a few taps stays far below 2^53), then the same rounding. Filters:
bilinear, bicubic, lanczos, box, hamming (not nearest). Supported processors:
:data:`SUPPORTED_IMAGE_PROCESSORS`. The model's own tower and projector then take the result
(:func:`~fastlight.vla.hf_vlm.image_features`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

#: Image processors whose pipeline :class:`ImagePreprocessor` reproduces (class names without "Pil").
SUPPORTED_IMAGE_PROCESSORS = ("CLIPImageProcessor", "SiglipImageProcessor", "Idefics3ImageProcessor")

#: Fractional bits of Pillow's fixed-point resampling weights (``PRECISION_BITS`` in Resample.c).
PIL_PRECISION_BITS = 22


def _bicubic(x: float, a: float = -0.5) -> float:
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    if x < 2.0:
        return (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return 0.0


def _sinc(x: float) -> float:
    if x == 0.0:
        return 1.0
    x *= math.pi
    return math.sin(x) / x


def _lanczos(x: float) -> float:
    return _sinc(x) * _sinc(x / 3.0) if -3.0 <= x < 3.0 else 0.0


def _bilinear(x: float) -> float:
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def _box(x: float) -> float:
    return 1.0 if -0.5 < x <= 0.5 else 0.0


def _hamming(x: float) -> float:
    x = abs(x)
    if x == 0.0:
        return 1.0
    if x >= 1.0:
        return 0.0
    x *= math.pi
    return math.sin(x) / x * (0.54 + 0.46 * math.cos(x))


#: Pillow's resampling filters by ``PIL.Image.Resampling`` value: (filter, support).
PIL_FILTERS: dict[int, tuple[Callable[[float], float], float]] = {
    1: (_lanczos, 3.0), 2: (_bilinear, 1.0), 3: (_bicubic, 2.0), 4: (_box, 0.5), 5: (_hamming, 1.0),
}  # fmt: skip
_FILTER_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def pil_resize_weights(n_in: int, n_out: int, resample: int) -> Tensor:
    """Pillow's fixed-point weights of one axis, ``n_in -> n_out``, as a long matrix ``[n_out, n_in]``
    (Resample.c ``precompute_coeffs`` + ``normalize_coeffs_8bpc``)."""
    if resample not in PIL_FILTERS:
        name = _FILTER_NAMES.get(int(resample), str(resample))
        raise ValueError(
            f"image resample filter {name} is not supported "
            "(supported: bilinear, bicubic, lanczos, box, hamming)"
        )
    fn, support = PIL_FILTERS[resample]
    scale = n_in / n_out
    filter_scale = max(scale, 1.0)
    support *= filter_scale
    weights = torch.zeros(n_out, n_in, dtype=torch.long)
    one = 1 << PIL_PRECISION_BITS
    for xx in range(n_out):
        centre = (xx + 0.5) * scale
        lo = max(int(centre - support + 0.5), 0)
        hi = min(int(centre + support + 0.5), n_in)
        k = [fn((x - centre + 0.5) / filter_scale) for x in range(lo, hi)]
        total = sum(k)
        if total != 0.0:
            k = [w / total for w in k]
        weights[xx, lo:hi] = torch.tensor([int(w * one + (0.5 if w >= 0 else -0.5)) for w in k])
    return weights


@dataclass(frozen=True)
class ImageSteps:
    """What an image processor does to an ``(h, w)`` image: successive resizes ``(h, w)``, an optional
    centre crop ``(h, w)``, the resample filter, the rescale factor and mean / std (``None``: skipped)."""

    resizes: tuple[tuple[int, int], ...]
    crop: tuple[int, int] | None
    resample: int
    rescale: float | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None


def _size_dict(size: Any) -> dict[str, int]:
    items = size.items() if hasattr(size, "items") else vars(size).items()
    return {k: int(v) for k, v in items if v is not None}


def _shortest_edge_size(h: int, w: int, short_side: int) -> tuple[int, int]:
    """transformers' ``get_resize_output_image_size(default_to_square=False)``."""
    short, long = (w, h) if w <= h else (h, w)
    if short == short_side:
        return h, w
    new_long = int(short_side * long / short)
    return (new_long, short_side) if w <= h else (short_side, new_long)


def _longest_edge_size(h: int, w: int, long_side: int) -> tuple[int, int]:
    """Idefics3's ``get_resize_output_image_size`` (longest edge to ``long_side``, even other side)."""
    aspect = w / h
    if w >= h:
        w, h = long_side, int(long_side / aspect)
        h += h % 2
    else:
        h, w = long_side, int(long_side * aspect)
        w += w % 2
    return max(h, 1), max(w, 1)


def image_steps(processor: Any, in_size: tuple[int, int]) -> ImageSteps:
    """The steps ``processor`` (one of :data:`SUPPORTED_IMAGE_PROCESSORS`) applies to ``in_size`` images."""
    name = type(processor).__name__.removesuffix("Pil")
    if name not in SUPPORTED_IMAGE_PROCESSORS:
        raise ValueError(
            f"image processor {name} is not supported for images (supported: "
            f"{', '.join(SUPPORTED_IMAGE_PROCESSORS)}); for a state-only env set "
            "--model.policy.init_args.image_size null"
        )
    h, w = in_size
    resizes: list[tuple[int, int]] = []
    size = _size_dict(processor.size) if getattr(processor, "size", None) is not None else {}
    if name == "Idefics3ImageProcessor":
        if getattr(processor, "do_image_splitting", False):
            raise ValueError(
                "Idefics3ImageProcessor with do_image_splitting=true is not supported (one image, one tile): "
                "set do_image_splitting false in the folder's preprocessor_config.json"
            )
        if processor.do_resize:
            resizes.append(_longest_edge_size(h, w, size["longest_edge"]))
        side = _size_dict(processor.max_image_size)["longest_edge"]
        resizes.append((side, side))
    elif processor.do_resize:
        if "height" in size and "width" in size:
            resizes.append((size["height"], size["width"]))
        elif set(size) == {"shortest_edge"}:
            resizes.append(_shortest_edge_size(h, w, size["shortest_edge"]))
        else:
            raise ValueError(
                f"image processor {name}: size {size} is not supported (height/width or shortest_edge)"
            )
    crop = None
    if getattr(processor, "do_center_crop", False):
        c = _size_dict(processor.crop_size)
        crop = (c["height"], c["width"])
        last = resizes[-1] if resizes else (h, w)
        if crop[0] > last[0] or crop[1] > last[1]:
            raise ValueError(f"image processor {name}: crop {crop} is larger than the resized image {last}")
    normalize = bool(getattr(processor, "do_normalize", False))
    return ImageSteps(
        resizes=tuple(resizes),
        crop=crop,
        resample=int(processor.resample if processor.resample is not None else 2),
        rescale=float(processor.rescale_factor) if getattr(processor, "do_rescale", False) else None,
        mean=tuple(float(m) for m in _triple(processor.image_mean)) if normalize else None,
        std=tuple(float(s) for s in _triple(processor.image_std)) if normalize else None,
    )


def _triple(v: Any) -> Sequence[float]:
    return [v] * 3 if isinstance(v, (int, float)) else list(v)


class ImagePreprocessor(nn.Module):
    """A VLM's image processor as batched torch ops: images ``[N, S, S, 3]`` uint8 (or float
    ``[N, 3, S, S]`` in ``[0, 1]``, taken as ``round(255 x)``) -> ``pixel_values [N, 3, h, w]`` float32.

    The resampling weights are long, non-persistent buffers (they follow the image processor, not the
    checkpoint; integer buffers are not part of the weight sync).

    Args:
        steps: :func:`image_steps` of the processor for ``in_size`` images.
        in_size: the env's image side ``S``.
    """

    def __init__(self, steps: ImageSteps, in_size: int) -> None:
        super().__init__()
        self.in_size, self.steps = int(in_size), steps
        self.passes: list[tuple[str, int]] = []  # (buffer name, axis: -1 width / -2 height)
        h, w = self.in_size, self.in_size
        for i, (nh, nw) in enumerate(steps.resizes):
            if (nh, nw) == (h, w):
                continue  # Pillow returns a copy for an unchanged size
            # Pillow: the horizontal pass first, then the vertical one (each skipped if unchanged).
            for axis, n_in, n_out in ((-1, w, nw), (-2, h, nh)):
                if n_in != n_out:
                    name = f"_resize{i}_{'w' if axis == -1 else 'h'}"
                    self.register_buffer(
                        name, pil_resize_weights(n_in, n_out, steps.resample), persistent=False
                    )
                    self.passes.append((name, axis))
            h, w = nh, nw
        self.size_before_crop = (h, w)

    @property
    def out_size(self) -> tuple[int, int]:
        return self.steps.crop or self.size_before_crop

    def forward(self, images: Tensor) -> Tensor:
        s = self.in_size
        if images.dtype == torch.uint8:
            if images.dim() != 4 or tuple(images.shape[1:]) != (s, s, 3):
                raise ValueError(
                    f"uint8 images must be [N, {s}, {s}, 3] (N, H, W, C), got {tuple(images.shape)}"
                )
            x = images.permute(0, 3, 1, 2).double()
        elif images.is_floating_point():
            if images.dim() != 4 or tuple(images.shape[1:]) != (3, s, s):
                raise ValueError(
                    f"float images must be [N, 3, {s}, {s}] (N, C, H, W), got {tuple(images.shape)}"
                )
            x = (images.double() * 255.0).round().clamp(0, 255)
        else:
            raise ValueError(
                f"images must be uint8 [N, H, W, C] or float [N, C, H, W], got dtype {images.dtype}"
            )
        half, one = float(1 << (PIL_PRECISION_BITS - 1)), float(1 << PIL_PRECISION_BITS)
        for name, axis in self.passes:
            weights = getattr(self, name).double()
            x = x @ weights.T if axis == -1 else weights @ x
            x = ((x + half) / one).floor().clamp(0.0, 255.0)
        if self.steps.crop is not None:
            (ch, cw), (h, w) = self.steps.crop, x.shape[-2:]
            top, left = (h - ch) // 2, (w - cw) // 2
            x = x[..., top : top + ch, left : left + cw]
        if self.steps.rescale is not None:
            x = x * self.steps.rescale
        x = x.float()
        if self.steps.mean is not None:
            # float32 from the processor's numbers on every call: a bf16 model's buffers would be bf16.
            mean = torch.tensor(self.steps.mean, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
            std = torch.tensor(self.steps.std, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
            x = (x - mean) / std
        return x.contiguous()
