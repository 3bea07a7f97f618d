"""Tiny, randomly initialised vision-language models saved as Hugging Face folders, built offline.

The way to try ``VLAPolicy(backbone=DIR)`` with a real VLM architecture without downloading one:
:func:`save_tiny_vlm` builds the model from transformers configs (random weights), a tokenizer trained
with ``tokenizers`` over the given sentences plus the architecture's special tokens, and the
architecture's image processor, and writes them with ``save_pretrained`` into one folder that
``AutoModelForImageTextToText`` / ``AutoProcessor`` load back. The vocabulary is the tokenizer's size
plus ``n_bins`` ids, so the action tokens (the last ``n_bins`` ids, OpenVLA's convention) are free::

    from fastlight.envs.instructions import INSTRUCTIONS
    from benchmarks.tiny_vlm import save_tiny_vlm

    save_tiny_vlm("llava", "runs/tiny_llava", sentences=list(INSTRUCTIONS.values()))

then ``fastlight fit --config configs/vla_metaworld_reach.yaml --model.policy.init_args.backbone
runs/tiny_llava``. Architectures (:data:`ARCHITECTURES`): ``llava`` (CLIP vision tower + Llama, the
layout of OpenVLA), ``paligemma`` (SigLIP + Gemma, tied embeddings), ``idefics3`` (Idefics3's
SigLIP-like tower, pixel-shuffle connector + Llama; SmolVLM's layout; its processor splits an image
into tiles plus a global view), ``qwen2_5_vl`` (Qwen2.5-VL: native-resolution patches and their grid,
window attention, multimodal RoPE) and ``gemma3`` (SigLIP, pooled projector + Gemma3, tied).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fastlight.extras import import_extra

#: The architectures :func:`save_tiny_vlm` builds.
ARCHITECTURES = ("llava", "paligemma", "idefics3", "qwen2_5_vl", "gemma3")

#: Special tokens of each architecture's tokenizer (bos, eos, unk, pad, then the image tokens, the
#: model's image placeholder first).
_QWEN = {"bos": "<|im_start|>", "eos": "<|im_end|>", "unk": "<|endoftext|>", "pad": "<|pad|>"}
_SPECIALS = {
    "llava": {"bos": "<s>", "eos": "</s>", "unk": "<unk>", "pad": "<pad>", "extra": ["<image>"]},
    "paligemma": {"bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>", "extra": ["<image>"]},
    "idefics3": {
        **_QWEN, "extra": ["<image>", "<fake_token_around_image>", "<end_of_utterance>", "<global-img>"],
    },
    "qwen2_5_vl": {
        **_QWEN, "extra": ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"],
    },
    "gemma3": {
        "bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>",
        "extra": ["<image_soft_token>", "<start_of_image>", "<end_of_image>"],
    },
}  # fmt: skip


def _tokenizer(arch: str, sentences: Sequence[str]) -> Any:
    """A BPE tokenizer over ``sentences`` with ``arch``'s special tokens, BOS prepended, right padding."""
    import_extra("tokenizers", extra="vla", what="the tiny VLM tokenizer")
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    transformers = import_extra("transformers", extra="vla", what="the tiny VLM tokenizer")
    sp = _SPECIALS[arch]
    specials = [sp["pad"], sp["unk"], sp["bos"], sp["eos"], *sp["extra"]]
    tok = Tokenizer(models.BPE(unk_token=sp["unk"]))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        [str(s) for s in sentences],
        trainers.BpeTrainer(vocab_size=256, special_tokens=specials, min_frequency=1),
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"{sp['bos']} $A", special_tokens=[(sp["bos"], tok.token_to_id(sp["bos"]))]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=sp["bos"], eos_token=sp["eos"], unk_token=sp["unk"],
        pad_token=sp["pad"], additional_special_tokens=sp["extra"],
    )  # fmt: skip
    fast.padding_side = "right"
    return fast


def _processor(arch: str, tokenizer: Any, image_size: int, patch_size: int) -> Any:
    """``arch``'s processor (its image processor at ``image_size`` and the tokenizer), or for
    ``qwen2_5_vl`` / ``gemma3`` the image processor alone (saved beside the tokenizer)."""
    t = import_extra("transformers", extra="vla", what="the tiny VLM processor")
    side = {"height": image_size, "width": image_size}
    if arch == "llava":
        ip = t.CLIPImageProcessorPil(size={"shortest_edge": image_size}, crop_size=side)
        return t.LlavaProcessor(
            image_processor=ip,
            tokenizer=tokenizer,
            patch_size=patch_size,
            vision_feature_select_strategy="default",
        )
    if arch == "paligemma":
        ip = t.SiglipImageProcessorPil(size=side)
        ip.image_seq_length = (image_size // patch_size) ** 2
        return t.PaliGemmaProcessor(image_processor=ip, tokenizer=tokenizer)
    if arch == "qwen2_5_vl":  # native resolution: any side that is a multiple of 2 patches, up to 2x
        area = {"shortest_edge": (2 * patch_size) ** 2, "longest_edge": (2 * image_size) ** 2}
        return t.Qwen2VLImageProcessorPil(
            size=area, patch_size=patch_size, merge_size=2, temporal_patch_size=2
        )
    if arch == "gemma3":
        return t.Gemma3ImageProcessorPil(size=side)
    ip = (
        t.Idefics3ImageProcessorPil(  # an image larger than the tower's side is cut into tiles + a global one
            size={"longest_edge": 2 * image_size}, max_image_size={"longest_edge": image_size}
        )
    )
    return t.Idefics3Processor(
        image_processor=ip, tokenizer=tokenizer, image_seq_len=(image_size // patch_size) ** 2 // 4
    )


def _config(arch: str, vocab: int, ids: list[int], image_size: int, patch_size: int, hidden: int) -> Any:
    """``arch``'s config; ``ids`` are the ids of its image tokens (:data:`_SPECIALS`' ``extra``)."""
    t = import_extra("transformers", extra="vla", what="the tiny VLM config")
    vision = {
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": 2,
        "num_attention_heads": 2, "image_size": image_size, "patch_size": patch_size,
    }  # fmt: skip
    text = {
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2,
    }  # fmt: skip
    if arch == "llava":
        return t.LlavaConfig(
            vision_config=t.CLIPVisionConfig(**vision), text_config=t.LlamaConfig(**text),
            image_token_index=ids[0], image_seq_length=(image_size // patch_size) ** 2,
        )  # fmt: skip
    if arch == "paligemma":
        gemma = t.GemmaConfig(**{**text, "num_key_value_heads": 1, "head_dim": hidden // 2})
        return t.PaliGemmaConfig(
            vision_config=t.SiglipVisionConfig(**vision), text_config=gemma, image_token_index=ids[0],
            projection_dim=hidden, hidden_size=hidden, vocab_size=vocab,
        )  # fmt: skip
    if arch == "qwen2_5_vl":
        freqs = hidden // 4  # rotary frequencies of a head (2 heads), split into (time, row, column) sections
        hw = 3 * freqs // 8  # Qwen2.5-VL's own split: [16, 24, 24] of 64
        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [freqs - 2 * hw, hw, hw]}
        return t.Qwen2_5_VLConfig(
            text_config={**text, "rope_parameters": rope, "bos_token_id": None, "eos_token_id": None},
            image_token_id=ids[0], video_token_id=ids[1],
            vision_start_token_id=ids[2], vision_end_token_id=ids[3],
            vision_config={
                "depth": 2, "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_heads": 2,
                "patch_size": patch_size, "out_hidden_size": hidden, "window_size": 2 * patch_size,
                "fullatt_block_indexes": [1],
            },
        )  # fmt: skip
    if arch == "gemma3":
        gemma = t.Gemma3TextConfig(
            **{**text, "num_key_value_heads": 1, "head_dim": hidden // 2}, query_pre_attn_scalar=hidden // 2
        )
        return t.Gemma3Config(
            vision_config=t.SiglipVisionConfig(**vision), text_config=gemma, image_token_index=ids[0],
            boi_token_index=ids[1], eoi_token_index=ids[2], mm_tokens_per_image=4,
        )  # fmt: skip
    return t.Idefics3Config(
        vision_config=t.Idefics3VisionConfig(**vision), text_config=t.LlamaConfig(**text),
        image_token_id=ids[0], scale_factor=2,
    )  # fmt: skip


def save_tiny_vlm(
    arch: str,
    folder: str | Path,
    *,
    sentences: Sequence[str],
    n_bins: int = 256,
    image_size: int = 32,
    hidden_size: int = 32,
    seed: int = 0,
) -> Path:
    """Build a tiny random ``arch`` VLM (see :data:`ARCHITECTURES`) and save it with its processor.

    Args:
        arch: one of :data:`ARCHITECTURES`.
        folder: where to write (created); ``AutoModelForImageTextToText``, ``AutoImageProcessor`` and
            ``AutoTokenizer`` load it back (and ``AutoProcessor``, but for ``qwen2_5_vl`` and ``gemma3``).
        sentences: the instructions the tokenizer is trained on.
        n_bins: free ids at the end of the vocabulary for the action tokens.
        image_size: the vision tower's (square) input side; 16 patches per image (``idefics3``'s
            connector and ``qwen2_5_vl``'s merger merge 2x2 patches into a token, ``gemma3``'s projector
            pools them into 4 tokens; ``qwen2_5_vl`` takes other sides too, ``idefics3`` cuts larger images
            into ``image_size`` tiles).
        hidden_size: width of the vision tower and of the language model (2 layers each, 2 heads).
        seed: torch seed of the random weights.

    Returns the folder.
    """
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, got {arch!r}")
    if image_size < 8 or image_size % 8 or hidden_size < 8 or hidden_size % 4:
        raise ValueError(
            "image_size must be a multiple of 8 and hidden_size a multiple of 4 (>= 8), "
            f"got {image_size} and {hidden_size}"
        )
    if n_bins < 2:
        raise ValueError(f"n_bins must be >= 2, got {n_bins}")
    t = import_extra("transformers", extra="vla", what="the tiny VLM")
    patch = image_size // 4
    tokenizer = _tokenizer(arch, sentences)
    processor = _processor(arch, tokenizer, image_size, patch)  # PaliGemma's adds its location tokens
    tokenizer = getattr(processor, "tokenizer", tokenizer)
    vocab = len(tokenizer) + n_bins
    ids = tokenizer.convert_tokens_to_ids(_SPECIALS[arch]["extra"])
    config = _config(arch, vocab, ids, image_size, patch, hidden_size)
    torch.manual_seed(seed)
    model = t.AutoModelForImageTextToText.from_config(config)
    if arch == "gemma3":  # its projector starts at zero (for fine-tuning): the image would not reach the LM
        torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.5)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    if not hasattr(processor, "tokenizer"):  # an image processor alone
        tokenizer.save_pretrained(out)
    return out


def save_tiny_pi0(
    folder: str | Path,
    *,
    sentences: Sequence[str],
    chunk_size: int = 4,
    action_dim: int = 4,
    state_dim: int = 39,
    hidden_size: int = 32,
    seed: int = 0,
) -> Path:
    """A tiny random pi0 (``PI0ForConditionalGeneration``: PaliGemma's SigLIP (32x32 images, 8x8 patches)
    and Gemma, plus a Gemma action expert of the same depth, 2 layers) saved with a PaliGemma processor
    (tokenizer trained on ``sentences``, SigLIP image processor), for
    ``FlowVLAPolicy(backbone=folder)``; ``chunk_size`` / ``action_dim`` / ``state_dim`` are the model's
    ``chunk_size`` / ``max_action_dim`` / ``max_state_dim``. Returns the folder."""
    from fastlight.vla.flow_policy import build_pi0

    processor = _processor("paligemma", _tokenizer("paligemma", sentences), 32, 8)
    torch.manual_seed(seed)
    model = build_pi0(len(processor.tokenizer), hidden_size, 2, chunk_size, action_dim, state_dim)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def save_tiny_pi05(
    folder: str | Path,
    *,
    sentences: Sequence[str],
    chunk_size: int = 4,
    action_dim: int = 4,
    hidden_size: int = 32,
    seed: int = 0,
) -> Path:
    """A tiny random pi0.5 (``PI05ForConditionalGeneration``: PaliGemma's SigLIP and Gemma, plus a Gemma
    action expert of the same depth whose norms take the denoising time, adaRMS), 2 layers, saved with a
    PaliGemma processor whose tokenizer is trained on ``sentences`` and on the digits and words of
    pi0.5's prompt (``Task: ..., State: 12 200 ...;\\nAction:``), for ``FlowVLAPolicy(backbone=folder)``.
    ``chunk_size`` / ``action_dim`` are the model's; the state goes into the prompt. Returns the folder."""
    from fastlight.vla.flow_policy import build_pi0

    words = [*sentences, "Task: , State: ;\nAction: ", " ".join(str(b) for b in range(256))]
    processor = _processor("paligemma", _tokenizer("paligemma", words), 32, 8)
    torch.manual_seed(seed)
    model = build_pi0(len(processor.tokenizer), hidden_size, 2, chunk_size, action_dim, 0, pi05=True)
    for name, param in model.named_parameters():
        # The adaRMS gates start at zero (adaLN-Zero): every expert block would be the identity, the
        # prompt (instruction and state) could not reach the actions. A trained checkpoint's are not zero.
        if ".input_layernorm.dense." in name or ".post_attention_layernorm.dense." in name:
            torch.nn.init.normal_(param, std=0.2)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out
