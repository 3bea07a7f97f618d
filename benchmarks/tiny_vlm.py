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
layout of OpenVLA), ``paligemma`` (SigLIP + Gemma, tied embeddings) and ``idefics3`` (Idefics3's
SigLIP-like tower, pixel-shuffle connector + Llama; SmolVLM's layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fastlight.extras import import_extra

#: The architectures :func:`save_tiny_vlm` builds.
ARCHITECTURES = ("llava", "paligemma", "idefics3")

#: Special tokens of each architecture's tokenizer (bos, eos, unk, pad, then the image tokens).
_SPECIALS = {
    "llava": {"bos": "<s>", "eos": "</s>", "unk": "<unk>", "pad": "<pad>", "extra": ["<image>"]},
    "paligemma": {"bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>", "extra": ["<image>"]},
    "idefics3": {
        "bos": "<|im_start|>", "eos": "<|im_end|>", "unk": "<|endoftext|>", "pad": "<|pad|>",
        "extra": ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"],
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
    """``arch``'s processor: its image processor (PIL backend) at ``image_size`` and the tokenizer."""
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
    ip = t.Idefics3ImageProcessorPil(
        size={"longest_edge": image_size},
        max_image_size={"longest_edge": image_size},
        do_image_splitting=False,
    )
    return t.Idefics3Processor(
        image_processor=ip, tokenizer=tokenizer, image_seq_len=(image_size // patch_size) ** 2 // 4
    )


def _config(arch: str, vocab: int, image_token_id: int, image_size: int, patch_size: int, hidden: int) -> Any:
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
            image_token_index=image_token_id, image_seq_length=(image_size // patch_size) ** 2,
        )  # fmt: skip
    if arch == "paligemma":
        gemma = t.GemmaConfig(**{**text, "num_key_value_heads": 1, "head_dim": hidden // 2})
        return t.PaliGemmaConfig(
            vision_config=t.SiglipVisionConfig(**vision), text_config=gemma, image_token_index=image_token_id,
            projection_dim=hidden, hidden_size=hidden, vocab_size=vocab,
        )  # fmt: skip
    return t.Idefics3Config(
        vision_config=t.Idefics3VisionConfig(**vision), text_config=t.LlamaConfig(**text),
        image_token_id=image_token_id, scale_factor=2,
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
        arch: ``llava``, ``paligemma`` or ``idefics3``.
        folder: where to write (created); ``AutoModelForImageTextToText.from_pretrained(folder)`` and
            ``AutoProcessor.from_pretrained(folder)`` load it back.
        sentences: the instructions the tokenizer is trained on.
        n_bins: free ids at the end of the vocabulary for the action tokens.
        image_size: the vision tower's (square) input side; 16 patches per image (8 with ``idefics3``'s
            connector, which merges 2x2 patches: 4).
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
    vocab = len(processor.tokenizer) + n_bins
    image_token_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    config = _config(arch, vocab, image_token_id, image_size, patch, hidden_size)
    torch.manual_seed(seed)
    model = t.AutoModelForImageTextToText.from_config(config)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out
