"""VLAPolicy: policy interface, decoding modes, pruned/unpruned agreement, from_pretrained, masks."""

from __future__ import annotations

import pytest
import torch

from fastlight.models.base import Policy
from fastlight.vla.hf_vlm import build_llama
from fastlight.vla.policy import VLAPolicy
from fastlight.vla.pruning import prune_lm_head

V, H, BINS, K = 600, 32, 32, 4
TINY = {
    "vocab_size": V, "hidden_size": H, "intermediate_size": 64, "n_bins": BINS, "action_dim": K,
    "image_size": 16, "patch_size": 8, "proprio_dim": 3, "max_text_len": 8, "value_mlp_hidden": 16,
}  # fmt: skip
MODES = ["parallel", "autoregressive"]


def _obs(n: int = 3, pad_to: int = 5, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = [2, 3, 5][:n] + [4] * max(0, n - 3)
    ids = torch.zeros(n, pad_to, dtype=torch.long)
    mask = torch.zeros(n, pad_to, dtype=torch.long)
    words = torch.randint(3, 500, (n, 5), generator=g)
    for i, length in enumerate(lengths):
        ids[i, :length], mask[i, :length] = words[i, :length], 1
    return {
        "image": torch.randint(0, 256, (n, 16, 16, 3), dtype=torch.uint8, generator=g),
        "proprio": torch.randn(n, 3, generator=g),
        "instruction_ids": ids,
        "instruction_mask": mask,
    }


def _policy(**kw) -> VLAPolicy:
    torch.manual_seed(0)
    return VLAPolicy(**{**TINY, **kw}).eval()


@pytest.mark.parametrize("decoding", MODES)
@pytest.mark.parametrize("deterministic", [False, True])
def test_act_and_evaluate_agree(decoding: str, deterministic: bool) -> None:
    policy = _policy(decoding=decoding)
    assert isinstance(policy, Policy)
    obs, step = _obs(), torch.tensor([0, 4, 9])
    with torch.no_grad():
        out = policy.act(obs, step=step, deterministic=deterministic)
        ev = policy.evaluate(obs, out.actions, step=step)
        val = policy.value(obs, step=step)
    assert out.actions.shape == out.logprobs.shape == ev.logprobs.shape == ev.entropy.shape == (3, K)
    assert out.actions.dtype == torch.long and out.values.shape == ev.values.shape == val.shape == (3,)
    assert int(out.actions.min()) >= 0 and int(out.actions.max()) < BINS
    torch.testing.assert_close(ev.logprobs, out.logprobs, rtol=0, atol=1e-5)
    torch.testing.assert_close(ev.values, out.values, rtol=0, atol=1e-6)
    torch.testing.assert_close(val, out.values, rtol=0, atol=1e-6)
    assert bool((ev.entropy > 0).all()) and bool((ev.entropy <= torch.log(torch.tensor(BINS)) + 1e-5).all())
    env_action = policy.bins_to_env_action(out.actions)
    assert env_action.dtype == torch.float32 and float(env_action.abs().max()) <= 1.0


def test_deterministic_act_is_the_argmax() -> None:
    policy = _policy()
    obs = _obs()
    with torch.no_grad():
        logits, _ = policy(obs)
        out = policy.act(obs, deterministic=True)
    assert torch.equal(out.actions, logits.argmax(-1))


def test_decoding_setting_changes_conditioning() -> None:
    obs = _obs()
    a = torch.zeros(3, K, dtype=torch.long)
    b = a.clone()
    b[:, 0] = BINS - 1  # change only the first token
    for decoding, depends in (("parallel", False), ("autoregressive", True)):
        policy = _policy(decoding=decoding)
        with torch.no_grad():
            lp_a = policy.evaluate(obs, a).logprobs
            lp_b = policy.evaluate(obs, b).logprobs
        if depends:  # token 0 conditions the later tokens: a real change, not rounding
            assert (lp_a[:, 1:] - lp_b[:, 1:]).abs().max() > 1e-4, decoding
        else:  # the same inputs reach the same kernels: the later tokens are untouched, bit for bit
            assert torch.equal(lp_a[:, 1:], lp_b[:, 1:]), decoding
        assert torch.allclose(lp_a[:, 0], lp_b[:, 0]) is False  # token 0's own logprob changes


@pytest.mark.parametrize("decoding", MODES)
def test_temperature_tempers_sampling_and_scoring_not_the_argmax_or_forward(decoding: str) -> None:
    obs = _obs()
    cold, plain = _policy(decoding=decoding, temperature=0.5), _policy(decoding=decoding)
    with torch.no_grad():
        greedy = cold.act(obs, deterministic=True).actions
        assert torch.equal(greedy, plain.act(obs, deterministic=True).actions)
        torch.testing.assert_close(cold(obs)[0], plain(obs)[0])  # SFT / self-imitation logits
        torch.manual_seed(3)
        acted = cold.act(obs)
        out = cold.evaluate(obs, acted.actions)
        torch.testing.assert_close(out.logprobs, acted.logprobs, rtol=1e-5, atol=1e-5)  # behaviour = learner
        logits = plain(obs, actions=acted.actions)[0]
        expected = torch.log_softmax(logits / 0.5, -1).gather(-1, acted.actions[..., None])[..., 0]
        torch.testing.assert_close(out.logprobs, expected, rtol=1e-5, atol=1e-5)
        assert bool((out.entropy < plain.evaluate(obs, acted.actions).entropy).all())  # sharper
    with pytest.raises(ValueError, match="--model.policy.init_args.temperature must be > 0"):
        _policy(temperature=0.0)


@pytest.mark.parametrize("decoding", MODES)
def test_pruned_and_unpruned_heads_agree(decoding: str) -> None:
    pruned, full = _policy(decoding=decoding), _policy(decoding=decoding, prune_head=False)
    assert pruned.backbone.get_output_embeddings().out_features == BINS
    assert full.backbone.get_output_embeddings().out_features == V
    obs, actions = _obs(), torch.randint(0, BINS, (3, K))
    with torch.no_grad():
        lp, hp = pruned(obs, actions)
        lf, hf = full(obs, actions)
    assert lp.shape == (3, K, BINS) and hp.shape == (3, K, H)
    torch.testing.assert_close(hp, hf, rtol=0, atol=0)  # same backbone, same shapes: the head is not involved
    # The pruned head is a [BINS, H] GEMM, the full one [V, H] then sliced: different kernels may
    # round differently, so 1e-5 (logits are O(1); a head off by one row differs by ~0.1).
    torch.testing.assert_close(lp, lf, rtol=1e-5, atol=1e-5)


def test_padding_is_masked() -> None:
    policy = _policy()
    obs = _obs(pad_to=5)
    longer = _obs(pad_to=8)
    noisy = {
        **obs,
        "instruction_ids": torch.where(obs["instruction_mask"].bool(), obs["instruction_ids"], 77),
    }
    with torch.no_grad():
        ref, _ = policy(obs)
        torch.testing.assert_close(policy(noisy)[0], ref, rtol=0, atol=1e-6)  # pad content is invisible
        torch.testing.assert_close(policy(longer)[0], ref, rtol=0, atol=1e-5)  # so is the amount of padding
        unmasked = {**noisy, "instruction_mask": torch.ones_like(obs["instruction_mask"])}
        assert not torch.allclose(policy(unmasked)[0], ref, atol=1e-4)


def test_image_and_step_are_used() -> None:
    policy = _policy()
    obs = _obs()
    no_image = {k: v for k, v in obs.items() if k != "image"}
    with torch.no_grad():
        assert not torch.allclose(policy(obs)[0], policy(no_image)[0])
        v0 = policy.value(obs, step=torch.zeros(3, dtype=torch.long))
        v1 = policy.value(obs, step=torch.full((3,), 100))
    assert not torch.allclose(v0, v1)


def test_from_pretrained_round_trip(tmp_path) -> None:
    torch.manual_seed(3)
    llama = build_llama(V, H, 2, 4, 64).eval()
    llama.save_pretrained(tmp_path)
    ids = torch.randint(0, V, (2, 7))
    with torch.no_grad():
        ref = llama(input_ids=ids).logits
        full = VLAPolicy(backbone=str(tmp_path), prune_head=False, n_bins=BINS).eval()
        assert torch.equal(full.backbone(input_ids=ids).logits, ref)
        pruned = VLAPolicy(backbone=str(tmp_path), n_bins=BINS).eval()
        # [BINS, H] vs [V, H] head GEMMs: equal up to rounding (1e-5; a wrong row range is off by ~0.1).
        torch.testing.assert_close(
            pruned.backbone(input_ids=ids).logits, ref[..., V - BINS :], rtol=1e-5, atol=1e-5
        )
        assert (pruned.backbone(input_ids=ids).logits - ref[..., V - BINS - 1 : V - 1]).abs().max() > 1e-2
    assert pruned.backbone.config.hidden_size == H  # the folder's sizes win over the defaults


def test_pruned_folder_loads_back(tmp_path) -> None:
    llama = build_llama(V, H, 1, 4, 64)
    prune_lm_head(llama, V - BINS, V)
    llama.save_pretrained(tmp_path)
    policy = VLAPolicy(backbone=str(tmp_path), n_bins=BINS)
    assert torch.equal(policy.backbone.get_output_embeddings().weight, llama.get_output_embeddings().weight)
    with pytest.raises(ValueError, match="prune_head=True"):
        VLAPolicy(backbone=str(tmp_path), n_bins=BINS, prune_head=False)
    with pytest.raises(ValueError, match="n_bins=16"):
        VLAPolicy(backbone=str(tmp_path), n_bins=16)


def test_tied_backbone_is_pruned_and_untied() -> None:
    policy = _policy(tie_word_embeddings=True)
    emb = policy.backbone.get_input_embeddings().weight
    head = policy.backbone.get_output_embeddings().weight
    assert emb.shape == (V, H) and head.shape == (BINS, H)
    assert policy.backbone.config.tie_word_embeddings is False
    assert policy.act(_obs()).actions.shape == (3, K)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"decoding": "beam"}, "decoding must be one of"), ({"action_dim": 0}, "action_dim"),
     ({"n_bins": V + 1}, "n_bins"), ({"max_text_len": 0}, "max_text_len"),
     ({"hidden_size": 30}, "num_attention_heads"), ({"image_size": 20}, "patch_size")],
)  # fmt: skip
def test_bad_settings_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        VLAPolicy(**{**TINY, **kwargs})


def test_bad_observations_raise() -> None:
    policy = _policy()
    obs = _obs()
    with pytest.raises(ValueError, match="proprio"):
        policy.act({k: v for k, v in obs.items() if k != "proprio"})
    with pytest.raises(ValueError, match="proprio_dim=0"):
        _policy(proprio_dim=0).act(obs)
    with pytest.raises(ValueError, match="max_text_len"):
        policy.act({**obs, "instruction_ids": torch.zeros(3, 9, dtype=torch.long), "instruction_mask": None})
    with pytest.raises(ValueError, match="instruction_mask shape"):
        policy.act({**obs, "instruction_mask": torch.ones(3, 2)})
    with pytest.raises(ValueError, match=r"actions must be integer bins \[N=3, K=4\]"):
        policy.evaluate(obs, torch.zeros(3, K + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="step must be"):
        policy.value(obs, step=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="dict"):
        policy.act(torch.zeros(3, 4))
