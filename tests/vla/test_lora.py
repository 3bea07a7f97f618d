"""LoRA on the VLA backbone's language model (peft): what trains and what is frozen, what an update
changes, checkpoints, a VLM's vision tower left alone, and the settings' one-line errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fastlight.extras import MissingExtraError
from fastlight.vla.lora import LoRASettings, apply_lora
from fastlight.vla.policy import VLAPolicy

TINY = {
    "vocab_size": 96, "n_bins": 16, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 64, "proprio_dim": 3, "value_mlp_hidden": 16, "max_episode_steps": 8,
    "image_size": 32, "patch_size": 16,
}  # fmt: skip
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def policy(seed: int = 0, **kw) -> VLAPolicy:
    torch.manual_seed(seed)
    return VLAPolicy(**{**TINY, **kw})


def obs(n: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {
        "instruction_ids": torch.randint(0, 80, (n, 4), generator=g),
        "proprio": torch.randn(n, 3, generator=g),
        "image": torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8, generator=g),
    }


def trainable(p: torch.nn.Module) -> set[str]:
    return {n for n, t in p.named_parameters() if t.requires_grad}


def test_only_adapters_and_the_small_modules_train():
    p = policy(lora=LORA)
    assert p.lora == LoRASettings(r=4, alpha=8, target_modules=("q_proj", "v_proj"))
    lm = {n for n in trainable(p) if n.startswith("backbone.model.")}
    # 2 layers x (q_proj, v_proj) x (lora_A, lora_B), and nothing else of the language model
    assert lm == {
        f"backbone.model.layers.{i}.self_attn.{m}.lora_{ab}.default.weight"
        for i in range(2) for m in ("q_proj", "v_proj") for ab in "AB"
    }  # fmt: skip
    assert {"backbone.lm_head.weight", "action_queries", "proprio_proj.weight"} <= trainable(p)
    assert {n for n, _ in p.value_head.named_parameters(prefix="value_head")} <= trainable(p)
    frozen = {n for n, t in p.named_parameters() if not t.requires_grad}
    assert "backbone.model.embed_tokens.weight" in frozen
    assert "backbone.model.layers.0.self_attn.q_proj.base_layer.weight" in frozen
    assert "backbone.model.layers.1.mlp.down_proj.weight" in frozen
    assert p.backbone.lm_head.weight.shape == (16, 32)  # still pruned to the bins, not adapted
    assert trainable(policy()) == {n for n, _ in policy().named_parameters()}  # no lora: all train


def test_an_update_moves_the_adapters_and_never_the_base_weights():
    p = policy(lora=LORA)
    before = {n: t.detach().clone() for n, t in p.named_parameters()}
    opt = torch.optim.SGD([t for t in p.parameters() if t.requires_grad], lr=0.1)
    for _ in range(2):  # lora_B starts at 0: the second step is the first to move lora_A
        out = p.evaluate(obs(), torch.randint(0, 16, (3, 4)))
        opt.zero_grad()
        (-out.logprobs.mean() + out.values.pow(2).mean()).backward()
        opt.step()
    moved = {n for n, t in p.named_parameters() if not torch.equal(t, before[n])}
    assert moved == trainable(p)


def test_lora_checkpoints_round_trip_and_the_adapters_change_the_output():
    p = policy(seed=0, lora=LORA)
    with torch.no_grad():
        for name, t in p.named_parameters():
            if "lora_B" in name:  # 0 at init: give the adapters an effect
                t.normal_(std=0.5)
    q = policy(seed=1, lora=LORA)
    q.load_state_dict(p.state_dict())  # strict: the same keys
    actions = torch.randint(0, 16, (3, 4))
    want = p.evaluate(obs(), actions)
    got = q.evaluate(obs(), actions)
    assert torch.equal(want.logprobs, got.logprobs) and torch.equal(want.values, got.values)
    base = policy(seed=0)  # the same base weights without adapters
    base_state = {k.replace(".base_layer", ""): v for k, v in p.state_dict().items() if "lora_" not in k}
    base.load_state_dict(base_state)
    assert (base.evaluate(obs(), actions).logprobs - want.logprobs).abs().max() > 1e-3
    assert any("lora_A.default" in k for k in p.state_dict())


def test_a_vlm_gets_adapters_in_its_language_model_only():
    transformers = pytest.importorskip("transformers")
    text = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                    num_key_value_heads=4, intermediate_size=64)  # fmt: skip
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=4, image_size=32, patch_size=8)  # fmt: skip
    vlm = transformers.LlavaForConditionalGeneration(
        transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_index=63)
    )
    assert apply_lora(vlm, LoRASettings(r=2, alpha=4, target_modules=("q_proj", "v_proj"))) == 2
    adapted = {n for n, t in vlm.named_parameters() if t.requires_grad and "lora_" in n}
    assert adapted and all(n.startswith("model.language_model.") for n in adapted)
    vision_params = dict(vlm.model.vision_tower.named_parameters())
    assert vision_params and not any("lora_" in n for n in vision_params)  # its q_proj / v_proj too
    assert all(t.requires_grad for t in vision_params.values())  # freeze_vision decides, not LoRA
    assert all(t.requires_grad for t in vlm.model.multi_modal_projector.parameters())
    assert vlm.lm_head.weight.requires_grad


def test_a_tied_unpruned_head_keeps_training():
    p = policy(lora=LORA, prune_head=False, tie_word_embeddings=True)
    assert p.backbone.lm_head.weight is p.backbone.model.embed_tokens.weight
    assert p.backbone.lm_head.weight.requires_grad


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"r": 0}, r"^--model.policy.init_args.lora.r must be an integer >= 1, got 0$"),
        ({"alpha": -1.0}, r"^--model.policy.init_args.lora.alpha must be > 0, got -1.0$"),
        ({"dropout": 1.0}, r"^--model.policy.init_args.lora.dropout must be in \[0, 1\), got 1.0$"),
        ({"target_modules": []}, r"^--model.policy.init_args.lora.target_modules must name at least one"),
        ({"target_modules": "q_proj"}, r"^--model.policy.init_args.lora.target_modules must be a list"),
        (
            {"rank": 8},
            r"^--model.policy.init_args.lora.rank is not a LoRA setting; allowed: r, alpha, "
            r"target_modules, dropout$",
        ),
        (
            {"target_modules": ["query"]},
            r"^--model.policy.init_args.lora.target_modules=\['query'\] matches no layer of the backbone's "
            r"language model \(LlamaModel\); its linear layers are named \['down_proj', 'gate_proj', "
            r"'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj'\]$",
        ),
    ],
)
def test_bad_settings_are_one_line_naming_the_flag(lora, message):
    with pytest.raises(ValueError, match=message):
        policy(lora=lora)


def test_missing_peft_names_the_vla_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(
        MissingExtraError,
        match=r"^LoRA \(--model.policy.init_args.lora\) needs the vla "
        r"extra: pip install 'fastlight\[vla\]' \(no module named 'peft'\)$",
    ):
        policy(lora=LORA)


def test_a_bad_lora_flag_stops_fastlight_fit_with_one_line(monkeypatch, capsys, tmp_path):
    from fastlight.cli import main

    monkeypatch.setenv("FASTLIGHT_DEBUG", "0")
    config = Path(__file__).resolve().parents[2] / "configs" / "vla_metaworld_reach.yaml"
    argv = ["fastlight", "fit", "--config", str(config), "--data.start_method", "spawn"]
    argv += ["--model.policy.init_args.lora", "{r: 0, target_modules: [q_proj]}"]
    monkeypatch.setattr(sys, "argv", [*argv, "--trainer.default_root_dir", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("fastlight: error:")] == [
        "fastlight: error: --model.policy.init_args.lora.r must be an integer >= 1, got 0  "
        "(FASTLIGHT_DEBUG=1 shows the traceback)"
    ]
    assert "Traceback" not in err
