"""Hugging Face vision-language models from a local folder as :class:`~fastlight.vla.policy.VLAPolicy`
backbones: loading, the vision tower and projector, image preparation, and instruction re-tokenization.

Loading (:func:`load_backbone`). A folder whose config maps in ``AutoModelForImageTextToText`` (Llava,
PaliGemma, Idefics3, ...) loads as a vision-language model (VLM), one whose config maps in
``AutoModelForCausalLM`` as a language model (pruned folders through
:func:`~fastlight.vla.pruning.load_pruned_model`); anything else is refused in one line naming the
folder and its config class. A VLM's decoder is made causal (PaliGemma's text config asks for
bidirectional attention over its prefix; the policy's action slots must not see later slots).

Images (:class:`ImagePreprocessor`). The settings of the image processor saved in the folder (size,
centre crop, resample filter, rescale factor, mean / std) are applied with torch to the whole batch:
uint8 ``[N, H, W, 3]`` -> float ``[N, 3, h, w]``. Resizing reproduces Pillow's resampling (the PIL
backend of transformers' image processors) exactly: Pillow resizes 8-bit images in two separable
passes (width, then height) with fixed-point filter weights (22 fractional bits) and rounds to uint8
after each pass; :func:`pil_resize_weights` builds those integer weights as a matrix per axis, and a
pass is one float64 matmul (exact: ``255 x 2^22 x`` a few taps stays far below 2^53), then the same
rounding. Filters: bilinear, bicubic, lanczos, box, hamming (not nearest). Supported processors:
:data:`SUPPORTED_IMAGE_PROCESSORS`. :func:`image_features` then runs the model's own
``get_image_features`` (vision tower + projector) and returns ``[N, P, hidden]``.

Instructions (:func:`own_tokens`, :func:`match_rows`). An env emits its instructions as rows of its
own vocabulary (fastlight's Meta-World: a WordLevel vocabulary). Before any sampler starts, the
env's distinct rows and their sentences are handed to the policy, which tokenizes the sentences with
the folder's tokenizer once: a table ``env row [T, L] -> own ids / mask [T, L']``. At run time the
rows of a batch are found in that table by tensor comparison (:func:`match_rows`), no Python per env.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

#: Image processors whose pipeline :class:`ImagePreprocessor` reproduces (class names without "Pil").
SUPPORTED_IMAGE_PROCESSORS = ("CLIPImageProcessor", "SiglipImageProcessor", "Idefics3ImageProcessor")

#: The transformers module whose forward hooks capture hidden states (see :func:`reset_output_capture`).
_CAPTURE = "transformers.utils.output_capturing"

#: Fractional bits of Pillow's fixed-point resampling weights (``PRECISION_BITS`` in Resample.c).
PIL_PRECISION_BITS = 22


# ---------------------------------------------------------------------- loading
def _transformers() -> Any:
    return import_extra("transformers", extra="vla", what="the VLA policy")


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
    """The folder's image processor, PIL backend (the reference :class:`ImagePreprocessor` matches)."""
    return _transformers().AutoImageProcessor.from_pretrained(path, backend="pil")


# ---------------------------------------------------------------------- instructions
def own_tokens(tokenizer: Any, sentences: Sequence[str], vocab_rows: int) -> tuple[Tensor, Tensor]:
    """``sentences`` (T of them) -> right-padded ``(ids [T, L'], mask [T, L'])`` (long) in
    ``tokenizer``'s vocabulary, special tokens as the tokenizer adds them (pad id 0, masked)."""
    if len(sentences) == 0:
        raise ValueError("the instruction table needs at least one sentence, got none")
    rows = [list(tokenizer(str(s))["input_ids"]) for s in sentences]
    width = max(max(len(r) for r in rows), 1)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r, dtype=torch.long), 1
    if int(ids.max()) >= vocab_rows:
        raise ValueError(
            f"the tokenizer gives id {int(ids.max())}, beyond the model's {vocab_rows} input embeddings"
        )
    return ids, mask


def table_keys(ids: Tensor, mask: Tensor) -> Tensor:
    """Rows ``[T, L]`` as lookup keys: ids where the mask is set, ``-1`` elsewhere (padding ignored)."""
    return torch.where(mask.bool(), ids.long(), torch.full_like(ids.long(), -1))


def match_rows(ids: Tensor, mask: Tensor, keys: Tensor) -> Tensor:
    """Index ``[N]`` into the table ``keys [T, L]`` of each row of ``ids`` / ``mask`` ``[N, L_in]``.

    Rows compare on their masked tokens only (``-1`` padding, either width). A row with no real token
    (``mask`` all 0: a Rollout's padding step, whose outputs are masked out of every loss and statistic)
    maps to entry 0. Any other ``ids`` row found nowhere in the table raises a one-line ``ValueError``.
    """
    x = table_keys(ids, mask)
    width = max(x.shape[1], keys.shape[1])
    x = nn.functional.pad(x, (0, width - x.shape[1]), value=-1)
    k = nn.functional.pad(keys.to(x.device), (0, width - keys.shape[1]), value=-1)
    hit = (x.unsqueeze(1) == k.unsqueeze(0)).all(-1)  # [N, T]
    found = hit.any(-1) | ~mask.bool().any(-1)
    if not bool(found.all()):
        row = ids[int((~found).nonzero()[0, 0])]
        raise ValueError(
            f"instruction_ids row {row.tolist()} is not one of the {keys.shape[0]} instructions the policy's "
            "table holds (bound from the env's instructions before sampling): the env emits an instruction "
            "it did not declare"
        )
    return hit.int().argmax(-1)


# ---------------------------------------------------------------------- images
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
