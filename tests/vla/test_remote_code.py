"""Backbone folders that ship their own code (``auto_map`` in ``config.json``, as OpenVLA's does):
refused in one line without ``trust_remote_code`` (never transformers' interactive prompt), loaded
through the class their ``auto_map`` names with it, and never written to.

The folders are made offline: a tiny Llava (:func:`benchmarks.tiny_vlm.save_tiny_vlm`) or a random
Llama, plus a ``configuration_*.py`` / ``modeling_*.py`` pair that subclasses the transformers classes
under a model type transformers does not know.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.tiny_vlm import save_tiny_vlm
from fastlight.vla.hf_vlm import build_llama
from fastlight.vla.policy import VLAPolicy

SENTENCES = ("reach the goal position with the gripper", "push the puck to the goal")
BINS, K, SIDE, N = 32, 4, 32, 2
CODE = {
    "configuration_tiny_vla.py": """from transformers import LlamaConfig, LlavaConfig


class TinyVLAConfig(LlavaConfig):
    model_type = "tiny_vla"


class TinyLMConfig(LlamaConfig):
    model_type = "tiny_lm"
""",
    "modeling_tiny_vla.py": """from transformers import LlamaForCausalLM, LlavaForConditionalGeneration

from .configuration_tiny_vla import TinyLMConfig, TinyVLAConfig


class TinyVLAForActionPrediction(LlavaForConditionalGeneration):
    config_class = TinyVLAConfig


class TinyLMForActions(LlamaForCausalLM):
    config_class = TinyLMConfig
""",
}
#: auto_map entries by kind; "openvla" names only AutoModelForVision2Seq, as OpenVLA's folder does.
AUTO_MAPS = {
    "vlm": {"AutoModelForImageTextToText": "modeling_tiny_vla.TinyVLAForActionPrediction"},
    "openvla": {"AutoModelForVision2Seq": "modeling_tiny_vla.TinyVLAForActionPrediction"},
    "lm": {"AutoModelForCausalLM": "modeling_tiny_vla.TinyLMForActions"},
}


def plain_folder(kind: str, root: Path) -> Path:
    if kind == "lm":
        torch.manual_seed(0)
        build_llama(300, 32, 1, 2, 64).save_pretrained(root / "plain")
        return root / "plain"
    return save_tiny_vlm("llava", root / "plain", sentences=SENTENCES, n_bins=BINS)


def custom_folder(kind: str, root: Path) -> Path:
    """A copy of ``plain_folder`` whose config names the custom classes (model type, auto_map)."""
    plain, folder = plain_folder(kind, root), root / f"tiny_vla_{kind}"  # transformers' module name
    folder.mkdir()
    for f in plain.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    for name, code in CODE.items():
        (folder / name).write_text(code)
    config = json.loads((folder / "config.json").read_text())
    config_class = "TinyLMConfig" if kind == "lm" else "TinyVLAConfig"
    config["model_type"] = "tiny_lm" if kind == "lm" else "tiny_vla"
    config["auto_map"] = {"AutoConfig": f"configuration_tiny_vla.{config_class}", **AUTO_MAPS[kind]}
    (folder / "config.json").write_text(json.dumps(config))
    if kind != "lm":  # transformers renames Llava's saved head by model type, which is now "tiny_vla"
        weights = load_file(folder / "model.safetensors")
        weights["lm_head.weight"] = weights.pop("language_model.lm_head.weight")
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def make(folder: Path, kind: str, **kw) -> VLAPolicy:
    torch.manual_seed(1)
    image = {"image_size": None} if kind == "lm" else {"image_size": SIDE}
    return VLAPolicy(backbone=str(folder), n_bins=BINS, action_dim=K, value_mlp_hidden=16, **image, **kw)


def obs(kind: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    o = {
        "instruction_ids": torch.tensor([[8, 9, 0], [5, 6, 7]]),
        "instruction_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
    }
    if kind != "lm":
        o["image"] = torch.randint(0, 256, (N, SIDE, SIDE, 3), dtype=torch.uint8, generator=g)
    return o


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(f.relative_to(folder)): (f.stat().st_mtime_ns, f.stat().st_size) for f in folder.rglob("*")}


@pytest.mark.parametrize("kind", sorted(AUTO_MAPS))
def test_a_custom_code_folder_loads_with_trust_remote_code_only(kind, tmp_path, monkeypatch):
    folder = custom_folder(kind, tmp_path)
    before = listing(folder)
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("transformers prompted on the terminal"))
    with pytest.raises(ValueError) as e:
        make(folder, kind)
    auto = ", ".join(sorted(["AutoConfig", *AUTO_MAPS[kind]]))
    assert str(e.value) == (
        f"--model.policy.init_args.backbone {folder}: its config.json maps in its own code ({auto}); set "
        "--model.policy.init_args.trust_remote_code true to run it, or use a folder of a transformers "
        "architecture"
    )
    p = make(folder, kind, trust_remote_code=True).eval()
    cls = "TinyLMForActions" if kind == "lm" else "TinyVLAForActionPrediction"
    assert type(p.backbone).__name__ == cls and p.is_vlm == (kind != "lm")
    # The folder's code ran on the folder's weights: the same policy as over the plain folder, its
    # tokenizer (plain, none for "lm") re-tokenizing the same way.
    q = make(tmp_path / "plain", kind).eval()
    rows = (torch.tensor([[5, 6, 7], [8, 9, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]))
    assert p.bind_instructions(SENTENCES, *rows) == q.bind_instructions(SENTENCES, *rows) == (kind != "lm")
    with torch.no_grad():
        torch.testing.assert_close(p(obs(kind))[0], q(obs(kind))[0], rtol=0, atol=0)
    assert listing(folder) == before  # nothing written into the folder
