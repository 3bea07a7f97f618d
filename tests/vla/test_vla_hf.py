"""VLAPolicy over Hugging Face vision-language models from a folder, every family of
:data:`benchmarks.tiny_vlm.ARCHITECTURES` (Llava, PaliGemma, Idefics3, Qwen2.5-VL, Gemma3).

Every folder is a tiny random model from :func:`benchmarks.tiny_vlm.save_tiny_vlm` (built from
configs, saved with its image processor and tokenizer; nothing downloaded). The env's images are 48x48
(the towers take 32x32: the image processors resize, Idefics3's cuts 2x2 tiles plus a global view,
Qwen2.5-VL's keeps 48x48 as a 6x6 patch grid) and its instructions are rows of fastlight's WordLevel
vocabulary, re-tokenized by the folder's own tokenizer. Images go through the folder's image processor
(PIL backend here: no torchvision) and the model's own ``get_image_features``.
"""

from __future__ import annotations

import os
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch

from benchmarks.tiny_vlm import ARCHITECTURES, save_tiny_vlm
from fastlight.data.env_spec import bind_instruction_table
from fastlight.envs.instructions import InstructionTable
from fastlight.losses import gipo_loss
from fastlight.vla.hf_vlm import load_image_processor, load_tokenizer, projector, vision_tower
from fastlight.vla.image_encoder import image_tokens
from fastlight.vla.imitation_loss import token_cross_entropy
from fastlight.vla.policy import VLAPolicy
from tests.instruction_ids import instruction_ids

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SENTENCES = ("reach the goal position with the gripper", "push the puck to the goal", "open the drawer")
BINS, K, SIDE, PROPRIO, N = 32, 4, 48, 3, 4
POLICY = {"n_bins": BINS, "action_dim": K, "image_size": SIDE, "proprio_dim": PROPRIO, "max_text_len": 12,
          "value_mlp_hidden": 16}  # fmt: skip
#: Image tokens per 48x48 image: 4x4 patches (Llava, PaliGemma); 5 tiles of 2x2 merged patches
#: (Idefics3); a 6x6 grid merged 2x2 (Qwen2.5-VL); 4x4 patches pooled to 2x2 (Gemma3).
IMAGE_TOKENS = {"llava": 16, "paligemma": 16, "idefics3": 20, "qwen2_5_vl": 9, "gemma3": 4}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("vlm")
    return {a: str(save_tiny_vlm(a, root / a, sentences=SENTENCES, n_bins=BINS)) for a in ARCHITECTURES}


def env_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """The env's instruction rows ``[T, 10]`` (fastlight's WordLevel ids), one per sentence."""
    return instruction_ids(SENTENCES, 10, extra=SENTENCES)


def policy(folder: str, seed: int = 0, **kw) -> VLAPolicy:
    torch.manual_seed(seed)
    p = VLAPolicy(backbone=folder, **{**POLICY, **kw})
    ids, mask = env_rows()
    assert p.bind_instructions(SENTENCES, ids, mask)
    return p


def obs(seed: int = 1, tasks: tuple[int, ...] = (0, 1, 2, 0)) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids, mask = env_rows()
    return {
        "image": torch.randint(0, 256, (len(tasks), SIDE, SIDE, 3), dtype=torch.uint8, generator=g),
        "proprio": torch.randn(len(tasks), PROPRIO, generator=g),
        "instruction_ids": ids[list(tasks)],
        "instruction_mask": mask[list(tasks)],
    }


def frozen_names(p: VLAPolicy) -> set[str]:
    (tower,) = p._frozen_modules
    return {n for n, _ in p.named_modules() if n == tower or n.startswith(tower + ".")}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_loads_acts_and_evaluates(folders, arch):
    p = policy(folders[arch]).eval()
    assert p.is_vlm and p.vision is None and p.image_processor is not None
    o = obs()
    with torch.no_grad():
        out = p.act(o, step=torch.arange(N))
        ev = p.evaluate(o, out.actions, step=torch.arange(N))
        greedy = p.act(o, deterministic=True).actions
        logits, _ = p(o)
    assert out.actions.shape == (N, K) and out.actions.dtype == torch.long
    assert int(out.actions.min()) >= 0 and int(out.actions.max()) < BINS
    assert out.logprobs.shape == (N, K) and bool((out.logprobs <= 0).all()) and out.values.shape == (N,)
    assert bool(torch.isfinite(out.logprobs).all() and torch.isfinite(out.values).all())
    torch.testing.assert_close(ev.logprobs, out.logprobs, rtol=0, atol=1e-5)  # same policy, same tokens
    assert ev.entropy.shape == (N, K) and bool((ev.entropy > 0).all())
    assert torch.equal(greedy, logits.argmax(-1))
    # Rows 0 and 3 are the same task with different images: the image reaches the logits.
    assert not torch.allclose(logits[0], logits[3])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_train_mode_everywhere_but_the_frozen_tower(folders, arch):
    p = policy(folders[arch])
    frozen = frozen_names(p)
    tower = vision_tower(p.backbone)
    assert p._frozen_modules[0].startswith("backbone.") and frozen
    assert {n for n, m in p.named_modules() if not m.training} == frozen  # from_pretrained left eval mode
    assert not any(q.requires_grad for q in tower.parameters())
    trainable = {n for n, q in p.named_parameters() if q.requires_grad}
    assert trainable == {n for n, _ in p.named_parameters() if not n.startswith(p._frozen_modules[0] + ".")}
    proj = projector(p.backbone)  # None: Qwen2.5-VL's merger is inside its (frozen) tower
    assert (proj is None) == (arch == "qwen2_5_vl")
    assert proj is None or all(q.requires_grad for q in proj.parameters())
    p.eval()
    assert not any(m.training for m in p.modules())
    p.train()
    assert {n for n, m in p.named_modules() if not m.training} == frozen
    unfrozen = policy(folders[arch], freeze_vision=False)
    assert all(m.training for m in unfrozen.modules()) and unfrozen._frozen_modules == ()
    assert all(q.requires_grad for q in unfrozen.parameters())


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_one_gipo_update(folders, arch):
    p = policy(folders[arch])
    o = obs()
    with torch.no_grad():
        behaviour = p.eval().act(o)
    p.train()
    tower_before = [q.detach().clone() for q in vision_tower(p.backbone).parameters()]
    opt = torch.optim.Adam([q for q in p.policy_parameters() if q.requires_grad], lr=1e-2)
    ev = p.evaluate(o, behaviour.actions)
    advantages = torch.tensor([1.0, -1.0, 0.5, 2.0])
    loss, info = gipo_loss(
        logprobs=ev.logprobs, old_logprobs=behaviour.logprobs, advantages=advantages,
        valid=torch.ones(N, dtype=torch.bool),
    )  # fmt: skip
    assert torch.isfinite(loss) and abs(float(info["ratio_mean"]) - 1.0) < 1e-4  # on-policy: r = 1
    opt.zero_grad()
    loss.backward()
    assert all(q.grad is None for q in vision_tower(p.backbone).parameters())
    parts = (projector(p.backbone), p.backbone.get_output_embeddings(), p.backbone.get_decoder())
    for part in (q for q in parts if q is not None):
        assert any(q.grad is not None and q.grad.abs().sum() > 0 for q in part.parameters())
    head_before = p.backbone.get_output_embeddings().weight.detach().clone()
    opt.step()
    assert not torch.equal(head_before, p.backbone.get_output_embeddings().weight)
    with torch.no_grad():
        after = p.eval().evaluate(o, behaviour.actions)
    # The update raised the log-prob of the positive-advantage samples' tokens in sum.
    gain = (after.logprobs - behaviour.logprobs).sum(-1)
    assert float((gain * advantages).sum()) > 0
    assert all(
        torch.equal(a, b) for a, b in zip(tower_before, vision_tower(p.backbone).parameters(), strict=True)
    )


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_sft_steps_lower_the_cross_entropy(folders, arch):
    p = policy(folders[arch], decoding="autoregressive")
    o = obs()
    bins = torch.randint(0, BINS, (N, K), generator=torch.Generator().manual_seed(2))
    opt = torch.optim.Adam([q for q in p.parameters() if q.requires_grad], lr=3e-3)
    losses = []
    for _ in range(4):
        logits, _ = p(o, actions=bins)
        loss, _ = token_cross_entropy(logits=logits, bins=bins)
        opt.zero_grad()
        loss.backward()
        assert all(q.grad is None for q in vision_tower(p.backbone).parameters())
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 0.05, losses


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_checkpoint_round_trip_gives_identical_logits(folders, arch, tmp_path):
    p = policy(folders[arch], seed=0)
    with torch.no_grad():  # train the head a little so that loading must restore it
        p.backbone.get_output_embeddings().weight.add_(0.1)
    torch.save(p.state_dict(), tmp_path / "policy.pt")
    state = torch.load(tmp_path / "policy.pt")
    assert p.retokenizer.row_keys is not None  # bound, yet the table follows the env, not the file:
    assert not any(k.startswith("retokenizer.") for k in state)
    q = policy(folders[arch], seed=1)
    q.load_state_dict(state, strict=True)
    o = obs()
    with torch.no_grad():
        assert torch.equal(p.eval()(o)[0], q.eval()(o)[0])
        assert torch.equal(p.value(o), q.value(o))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_policy_that_ran_pickles_and_its_copy_acts_the_same(folders, arch):
    """What the inference worker gets at its start: the policy after it acted (transformers' capture
    hooks installed by then). Its unpickled copy must capture the hidden states again (Llava's
    ``vision_feature_layer``): the same greedy actions, log-probs and values as the original."""
    p = policy(folders[arch]).eval()
    o = obs()
    with torch.no_grad():
        before = p.act(o, deterministic=True)
        q = pickle.loads(pickle.dumps(p))
        after, again = q.act(o, deterministic=True), p.act(o, deterministic=True)
    for out in (after, again):
        assert torch.equal(out.actions, before.actions)
        torch.testing.assert_close(out.logprobs, before.logprobs, rtol=0, atol=1e-6)  # same kernels, shapes
        torch.testing.assert_close(out.values, before.values, rtol=0, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_pruned_and_unpruned_heads_agree(folders, arch):
    pruned, full = (
        policy(folders[arch], seed=0).eval(),
        policy(folders[arch], seed=0, prune_head=False).eval(),
    )
    tok = pruned.action_tokenizer
    vocab = full.backbone.get_output_embeddings().out_features
    assert (tok.first_id, tok.last_id) == (vocab - BINS, vocab)  # the last n_bins ids
    head = pruned.backbone.get_output_embeddings().weight
    assert head.shape[0] == BINS
    assert torch.equal(head, full.backbone.get_output_embeddings().weight[tok.first_id :])
    # Tied embeddings (PaliGemma) stay whole in the input embedding.
    emb = pruned.backbone.get_input_embeddings().weight
    assert emb.shape[0] == vocab and emb.data_ptr() != head.data_ptr()
    assert torch.equal(emb, full.backbone.get_input_embeddings().weight)
    o = obs()
    with torch.no_grad():
        # [BINS, H] vs [V, H] head GEMMs: equal up to rounding (1e-5; a row off by one differs by ~0.1).
        torch.testing.assert_close(pruned(o)[0], full(o)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llava", "paligemma"])
def test_a_pruned_vlm_folder_loads_back(folders, arch, tmp_path):
    """A pruned backbone saved with save_pretrained (Llava writes its head as
    ``language_model.lm_head.weight``; PaliGemma's was tied) loads back with the same weights."""
    from transformers import AutoProcessor

    p = policy(folders[arch]).eval()
    p.backbone.save_pretrained(tmp_path)
    AutoProcessor.from_pretrained(folders[arch]).save_pretrained(tmp_path)
    q = policy(str(tmp_path)).eval()
    assert q.backbone.config.action_token_range == [p.action_tokenizer.first_id, p.action_tokenizer.last_id]
    a, b = p.backbone.state_dict(), q.backbone.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The rest of the policy (placeholders, proprio projection, value head) is not in the folder.
    rest = {k: v for k, v in p.state_dict().items() if not k.startswith("backbone.")}
    assert q.load_state_dict(rest, strict=False).unexpected_keys == []
    with torch.no_grad():
        assert torch.equal(p(obs())[0], q(obs())[0])


def test_paligemma_decoder_is_causal(folders):
    """PaliGemma's config asks for bidirectional attention; the policy's decoder must stay causal,
    or slot k would see the action fed to slot k + 1 (autoregressive decoding)."""
    p = policy(folders["paligemma"]).eval()
    assert p.backbone.config.get_text_config().use_bidirectional_attention is False
    o = obs()
    with torch.no_grad():
        prefix = p._prefix(o)
        slots = p._slots(N, None)
        other = slots.clone()
        other[:, -1] += 1.0
        a, b = p._hidden(prefix, slots), p._hidden(prefix, other)
    assert torch.equal(a[:, :-1], b[:, :-1]) and not torch.allclose(a[:, -1], b[:, -1])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_image_tokens_are_the_models_own_features_image_by_image(folders, arch):
    """The policy's batched image tokens equal the model's own get_image_features on the folder's image
    processor output, one image at a time (Idefics3: its 5 tiles; Qwen2.5-VL: its patch grid)."""
    p = policy(folders[arch]).eval()
    images = obs()["image"]
    processor = load_image_processor(folders[arch])
    keys = ("pixel_values", "pixel_attention_mask", "image_grid_thw")
    with torch.no_grad():
        got, grid = image_tokens(p.backbone, p.vision, p.image_processor, SIDE, images)
        want = []
        for image in images.numpy():
            inputs = processor(images=[[image]], return_tensors="pt")
            out = p.backbone.get_image_features(**{k: inputs[k] for k in keys if k in inputs}).pooler_output
            want.append(
                torch.cat([f.reshape(-1, f.shape[-1]) for f in out])
                if isinstance(out, (list, tuple))
                else out[0]
            )
    assert got.shape == (N, IMAGE_TOKENS[arch], 32)
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-5, atol=1e-5)
    assert (grid is None) == (arch != "qwen2_5_vl")  # the grid of multimodal RoPE
    assert not torch.allclose(got[0], got[1])
    with pytest.raises(
        ValueError, match=r"^images must be uint8 \[N, 48, 48, 3\] \(N, H, W, C\) for the backbone"
    ):
        image_tokens(p.backbone, p.vision, p.image_processor, SIDE, images[:, :32, :32])


@pytest.mark.parametrize("arch", ["llava", "idefics3", "qwen2_5_vl"])
def test_the_prefix_runs_the_language_model_as_the_models_own_forward(folders, arch):
    """[image tokens][instruction] through the decoder with the policy's embeddings and position ids
    equals the model's own forward on the image placeholder ids (Qwen2.5-VL: its multimodal RoPE
    positions; the others: 1D). PaliGemma's and Gemma3's own forwards attend bidirectionally over the
    image (the policy stays causal), so they are not compared here."""
    p = policy(folders[arch], proprio_dim=0).eval()
    o = {k: v for k, v in obs().items() if k != "proprio"}
    processor = load_image_processor(folders[arch])
    inputs = processor(images=[[im] for im in o["image"].numpy()], return_tensors="pt")
    with torch.no_grad():
        emb, mask, pos = p._prefix(o)
        got = p.backbone.get_decoder()(
            inputs_embeds=emb, attention_mask=mask, position_ids=pos
        ).last_hidden_state
        ids, text_mask = p.retokenizer(o["instruction_ids"], o["instruction_mask"])
        tokens = IMAGE_TOKENS[arch]
        image_ids = torch.full((N, tokens), p.backbone.config.image_token_id)
        types = torch.cat([torch.ones(N, tokens, dtype=torch.int), torch.zeros_like(ids, dtype=torch.int)], 1)
        extra = {"mm_token_type_ids": types} if arch == "qwen2_5_vl" else {}
        own = p.backbone.model(
            input_ids=torch.cat([image_ids, ids], 1), attention_mask=mask, **inputs, **extra
        ).last_hidden_state
    assert pos.shape == ((3, N, emb.shape[1]) if arch == "qwen2_5_vl" else (N, emb.shape[1]))
    real = mask.bool()
    torch.testing.assert_close(got[real], own[real], rtol=1e-4, atol=1e-4)


def test_instruction_table_matches_a_naive_loop(folders):
    p = policy(folders["llava"])
    tokenizer = load_tokenizer(folders["llava"])
    ids, mask = env_rows()
    order = [2, 0, 0, 1, 2, 1]
    # The batch carries two extra padding columns: rows match on their real tokens only.
    batch_ids = torch.nn.functional.pad(ids[order], (0, 2), value=0)
    batch_mask = torch.nn.functional.pad(mask[order], (0, 2), value=0)
    got_ids, got_mask = p.retokenizer(batch_ids, batch_mask)
    for i, row in enumerate(batch_ids.tolist()):
        real = [t for t, m in zip(row, batch_mask[i].tolist(), strict=True) if m]
        task = next(t for t in range(len(SENTENCES)) if ids[t][mask[t].bool()].tolist() == real)
        want = tokenizer(SENTENCES[task])["input_ids"]
        assert got_ids[i, : len(want)].tolist() == want and got_mask[i].tolist() == [1] * len(want) + [0] * (
            got_mask.shape[1] - len(want)
        )
    unknown = batch_ids.clone()
    unknown[1, 1] = 3 if int(unknown[1, 1]) != 3 else 4
    with pytest.raises(ValueError, match=r"^instruction_ids row \[.*\] is not one of the 3 instructions"):
        p.retokenizer(unknown, batch_mask)
    # A Rollout's padding steps carry all-zero rows (no real token): they map to entry 0, whose
    # outputs the losses mask out (value recomputation runs the critic over every step).
    padded_ids, padded_mask = batch_ids.clone(), batch_mask.clone()
    padded_ids[3], padded_mask[3] = 0, 0
    got_pad, _ = p.retokenizer(padded_ids, padded_mask)
    assert torch.equal(got_pad[3], p.retokenizer.own_ids[0])
    assert torch.equal(got_pad[[0, 1, 2, 4, 5]], got_ids[[0, 1, 2, 4, 5]])
    # A policy without a tokenizer in its folder (here: none) passes the env's ids through.
    plain = VLAPolicy(**{**POLICY, "image_size": None, "vocab_size": 300, "hidden_size": 32})
    assert not plain.bind_instructions(SENTENCES, ids, mask)
    assert plain.retokenizer(ids, mask)[0] is ids


def test_a_folder_that_is_neither_vlm_nor_lm_is_refused(tmp_path):
    from transformers import ViTConfig

    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(tmp_path)
    msg = (
        f"--model.policy.init_args.backbone {tmp_path}: its config is a ViTConfig, neither a vision-language "
        "model (AutoModelForImageTextToText) nor a causal language model (AutoModelForCausalLM)"
    )
    with pytest.raises(ValueError) as e:
        VLAPolicy(backbone=str(tmp_path))
    assert str(e.value) == msg
    with pytest.raises(ValueError, match=r"backbone .*missing: not a local model folder \(no config.json"):
        VLAPolicy(backbone=str(tmp_path / "missing"))


def test_action_token_ids_choose_the_head_rows(folders):
    full = policy(folders["llava"], prune_head=False)
    p = policy(folders["llava"], action_token_ids=[10, 10 + BINS])
    assert (p.action_tokenizer.first_id, p.action_tokenizer.last_id) == (10, 10 + BINS)
    head = p.backbone.get_output_embeddings().weight
    assert torch.equal(head, full.backbone.get_output_embeddings().weight[10 : 10 + BINS])
    with pytest.raises(ValueError, match=r"action_token_ids must be \[first, last\) with last - first = "):
        policy(folders["llava"], action_token_ids=[10, 10 + BINS - 1])


def _space(image: int | None, text_len: int = 10) -> gym.spaces.Dict:
    spaces = {"proprio": gym.spaces.Box(-np.inf, np.inf, (PROPRIO,), np.float32)}
    if image is not None:
        spaces["image"] = gym.spaces.Box(0, 255, (image, image, 3), np.uint8)
    spaces["instruction_ids"] = gym.spaces.Box(0, 59, (text_len,), np.int64)
    spaces["instruction_mask"] = gym.spaces.Box(0, 1, (text_len,), np.int64)
    return gym.spaces.Dict(spaces)


def test_state_only_policy_builds_no_image_encoder():
    tiny = {**POLICY, "vocab_size": 300, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64}
    p = VLAPolicy(**{**tiny, "image_size": None})
    assert p.vision is None and not any(n.startswith("vision.") for n, _ in p.named_parameters())
    o = obs()
    with pytest.raises(ValueError) as e:
        p.act(o)
    assert str(e.value) == (
        "obs has 'image' (4, 48, 48, 3) but the policy has no image encoder "
        "(--model.policy.init_args.image_size=null): set --model.policy.init_args.image_size to the env's "
        "image side"
    )
    state = {k: v for k, v in o.items() if k != "image"}
    assert p.act(state).actions.shape == (N, K)
    p.check_obs_space(_space(None))
    with pytest.raises(ValueError) as e:
        p.check_obs_space(_space(SIDE))
    assert str(e.value) == (
        "the env renders images (48, 48, 3) but --model.policy.init_args.image_size=null builds no image "
        "encoder: set --model.policy.init_args.image_size=48 (or --data.env_kwargs.image false)"
    )
    with_encoder = VLAPolicy(**tiny)
    with_encoder.check_obs_space(_space(SIDE))
    with pytest.raises(ValueError) as e:
        with_encoder.check_obs_space(_space(None))
    assert str(e.value) == (
        "the env has no 'image' (state only) but --model.policy.init_args.image_size=48 builds an image "
        "encoder it would never use: set --model.policy.init_args.image_size=null"
    )
    small = VLAPolicy(**{**tiny, "vocab_size": 20 + BINS, "image_size": None})
    with pytest.raises(
        ValueError, match=r"instruction ids go up to 59 but the backbone has 52 input embeddings"
    ):
        small.check_obs_space(_space(None))


def test_state_only_vlm_freezes_its_tower_and_projector(folders):
    p = policy(folders["idefics3"], image_size=None)
    assert p.image_processor is None and len(p._frozen_modules) == 2
    for part in (vision_tower(p.backbone), projector(p.backbone)):
        assert not any(q.requires_grad for q in part.parameters()) and not part.training
    state = {k: v for k, v in obs().items() if k != "image"}
    ev = p.evaluate(state, torch.zeros(N, K, dtype=torch.long))
    (ev.logprobs.sum() + ev.values.sum()).backward()
    missing = [n for n, q in p.named_parameters() if q.requires_grad and q.grad is None]
    assert missing == []  # DDP would stop on any of them: "parameters that were not used"
    with pytest.raises(ValueError, match=r"--model.policy.init_args.image_size=null"):
        p.act(obs())


def test_the_env_table_binds_to_a_folder_with_a_tokenizer(folders):
    torch.manual_seed(0)
    p = VLAPolicy(backbone=folders["paligemma"], **POLICY)
    assert p.retokenizer.row_keys is None
    ids, mask = env_rows()
    table = InstructionTable(SENTENCES, ids.numpy(), mask.numpy())
    p.check_obs_space(_space(SIDE))
    assert bind_instruction_table(p, table)
    own = load_tokenizer(folders["paligemma"])(SENTENCES[1])["input_ids"]
    got, got_mask = p.retokenizer(ids[[1]], mask[[1]])
    assert got[0, : len(own)].tolist() == own and int(got_mask.sum()) == len(own)


@pytest.mark.slow  # a fit run: spawned sampler, 2 GIPO updates (~30 s on 2 busy cores)
@pytest.mark.parametrize("served", [False, True], ids=["sampler_copy", "inference_worker"])
def test_fit_and_evaluate_a_vlm_folder(tmp_path, monkeypatch, served):
    """Served: the policy reaches a spawned inference worker after it acted in the trainer (the
    example forward that sizes the worker's slots), transformers' capture hooks installed."""
    from fastlight.cli import cli_main
    from fastlight.envs.instructions import INSTRUCTIONS
    from fastlight.evaluate import main as evaluate

    folder = save_tiny_vlm("llava", tmp_path / "llava", sentences=list(INSTRUCTIONS.values()))
    cli = cli_main(
        ["fit", "--config", os.path.join(ROOT, "configs", "vla_metaworld_reach.yaml"),
         "--model.policy.init_args.backbone", str(folder), "--trainer.max_steps", "2",
         "--data.num_envs", "2", "--data.num_workers", "1", "--data.max_horizon", "10",
         "--data.env_kwargs.max_path_length", "10", "--model.num_minibatches", "1",
         "--model.update_epochs", "1", "--trainer.default_root_dir", str(tmp_path / "run"),
         "--trainer.enable_progress_bar", "false", *(["--data.inference", "{}"] if served else [])]
    )  # fmt: skip
    p = cli.model.policy
    assert cli.trainer.global_step == 2 and p.is_vlm
    assert p.retokenizer.row_keys.shape[0] == 1  # reach: one task
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    bound = []
    real = VLAPolicy.bind_instructions
    monkeypatch.setattr(VLAPolicy, "bind_instructions", lambda self, *a: bound.append(real(self, *a)) or True)
    result = evaluate(["--ckpt", str(ckpt), "--episodes", "1", "--out", str(tmp_path / "eval.json")])
    assert bound == [True] and result["summary"]["episodes"] == 1


def test_env_spec_carries_the_table_and_the_module_binds_it(folders):
    from fastlight.data.env_spec import EnvSpec
    from fastlight.envs.metaworld import MetaWorldEnv
    from fastlight.vla.module import VLAModule

    env = MetaWorldEnv("reach-v3,push-v3", image=False, proprio_dim=PROPRIO, max_text_len=10)
    spec = EnvSpec.from_env(env)
    table = spec.instructions
    assert table.sentences == env.instructions and np.array_equal(table.ids, env._ids)
    torch.manual_seed(0)
    m = VLAModule(policy=VLAPolicy(backbone=folders["llava"], **{**POLICY, "image_size": None}))
    m.check_env_spec(spec)
    p = m.policy
    assert p.retokenizer.row_keys.shape[0] == 2
    tokenizer = load_tokenizer(folders["llava"])
    got, _ = p.retokenizer(torch.as_tensor(env._ids[[1]]), torch.as_tensor(env._mask[[1]]))
    want = tokenizer(env.instructions[1])["input_ids"]
    assert got[0, : len(want)].tolist() == want
