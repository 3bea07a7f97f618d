"""VLAModule: an update on a Meta-World rollout, param groups, settings, value-loss isolation, CLI."""

from __future__ import annotations

import copy
import os

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from fastlight.data.datamodule import EnvSpec
from fastlight.envs.metaworld import MetaWorldEnv
from fastlight.losses import value_loss
from fastlight.models.mlp import MLPActorCritic
from fastlight.modules.minibatch import Minibatch
from fastlight.modules.objectives import GIPO, SAPO, PPOClip
from fastlight.rollout import Rollout
from fastlight.sampling.collector import Collector
from fastlight.vla.module import VLAModule
from fastlight.vla.policy import VLAPolicy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K = 4
TINY_POLICY = {
    "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "n_bins": 32,
    "image_size": 32, "patch_size": 16, "proprio_dim": 4, "value_mlp_hidden": 16, "max_episode_steps": 16,
}  # fmt: skip
TINY = {"update_epochs": 1, "num_minibatches": 2}


def module(seed: int = 0, **kw) -> VLAModule:
    """A VLAModule with an injected tiny VLAPolicy (``TINY_POLICY``) and the RL settings ``kw``."""
    torch.manual_seed(seed)
    return VLAModule(policy=VLAPolicy(**TINY_POLICY), **{**TINY, **kw})


def make_envs(n: int = 2) -> list[MetaWorldEnv]:
    return [MetaWorldEnv("reach-v3", image_size=32, proprio_dim=4, max_path_length=6) for _ in range(n)]


@pytest.fixture(scope="module")
def collected() -> tuple[dict, Rollout]:
    """A DPSA rollout of 2 Meta-World envs, sampled by a fresh module's policy (and its weights)."""
    behaviour = module(seed=1)
    collector = Collector(make_envs(), mode="dpsa", termination_threshold=1.0, max_horizon=8, seed=0)
    with torch.no_grad():
        rollout = Rollout.cat([collector.collect(behaviour.policy.eval()) for _ in range(2)], dim=0)
    collector.close()
    # Non-trivial rewards so that the advantages differ between steps.
    rollout = Rollout(**{**rollout.__dict__, "rewards": torch.randn(rollout.shape) * rollout.valid})
    return copy.deepcopy(behaviour.policy.state_dict()), rollout.validate()


def perturbed(seed: int, state: dict, **kw) -> VLAModule:
    """A module with the behaviour weights plus a fixed small perturbation (ratios != 1)."""
    m = module(**kw)
    m.policy.load_state_dict(state)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.policy.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    return m


def full_batch(m: VLAModule, rollout: Rollout) -> Minibatch:
    with torch.no_grad():
        adv, ret, values = m.compute_advantages(rollout)
    mb = Minibatch.from_rollout(rollout, adv, ret, values)
    return mb.select(mb.valid.nonzero().squeeze(-1))


def test_rollout_holds_token_actions(collected):
    _, r = collected
    t_len = r.shape[0]
    assert r.shape == (t_len, 2) and r.actions.shape == (t_len, 2, K) and r.actions.dtype == torch.long
    assert r.logprobs.shape == (t_len, 2, K) and r.obs["image"].shape == (t_len, 2, 32, 32, 3)
    assert int(r.actions.max()) < TINY_POLICY["n_bins"] and bool(r.terminated.any() or r.truncated.any())


def test_one_update_changes_policy_and_value_weights(collected):
    state, rollout = collected
    m = module()
    m.policy.load_state_dict(state)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu")  # fmt: skip
    trainer.fit(m, train_dataloaders=DataLoader([rollout], batch_size=None))
    assert m.policy_version == 1 and trainer.global_step == TINY["num_minibatches"]
    after = m.policy.state_dict()
    parts = ("backbone.model.layers.0.", "backbone.lm_head.", "vision.", "action_queries", "value_head.")
    for prefix in parts:
        changed = [not torch.equal(after[k], state[k]) for k in state if k.startswith(prefix)]
        assert changed and any(changed), prefix
    assert "loss/approx_kl" in trainer.callback_metrics and "loss/entropy" in trainer.callback_metrics


def test_value_head_has_its_own_param_group_and_lr():
    m = module(lr=1e-4, value_lr=3e-3)
    groups = m.configure_optimizers().param_groups
    assert [(g["name"], g["lr"]) for g in groups] == [("policy", 1e-4), ("value_head", 3e-3)]
    value_ids = {id(p) for p in m.policy.value_head.parameters()}
    assert {id(p) for p in groups[1]["params"]} == value_ids
    assert not value_ids & {id(p) for p in groups[0]["params"]}
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(list(m.policy.parameters()))
    assert module(lr=1e-4).configure_optimizers().param_groups[1]["lr"] == 1e-4  # value_lr=None: lr


def test_objective_and_granularity_change_the_update(collected):
    state, rollout = collected
    assert module().objective == GIPO()  # the default (AcceRL)
    assert module().hparams.objective == {"class_path": "fastlight.modules.objectives.GIPO",
                                          "init_args": {"sigma": 0.5, "clip_frac_eps": 0.2}}  # fmt: skip

    def grad(**kw) -> torch.Tensor:
        m = perturbed(7, state, **kw)
        mb = full_batch(m, rollout)
        out = m.evaluate_actions(mb)
        assert out.logprobs.shape == out.entropy.shape == (mb.valid.numel(), K) and mb.advantages.dim() == 1
        loss, info = m.compute_loss(mb, out, None)
        loss.backward()
        return m.policy.action_queries.grad.clone()

    settings = [
        {"objective": GIPO()},
        {"objective": PPOClip(clip_eps=0.01)},
        {"objective": SAPO()},
        {"objective": GIPO(), "ratio_granularity": "chunk"},
        {"objective": GIPO(sigma=0.01)},
        {"objective": PPOClip(clip_eps=0.01), "ratio_granularity": "chunk"},
        {"objective": SAPO(), "ratio_granularity": "chunk"},
    ]
    grads = [grad(**s) for s in settings]
    for i in range(len(grads)):
        for j in range(i + 1, len(grads)):
            assert not torch.allclose(grads[i], grads[j]), (settings[i], settings[j])
    # "action" granularity with one token per group is the token-level ratio, for each.
    for s in (settings[0], settings[1], settings[2]):
        torch.testing.assert_close(grad(**s, ratio_granularity="action", tokens_per_action=1), grad(**s))
    # By default an "action" group is the K tokens of the one env action (no chunks): a ratio of its
    # own, neither the token-level nor the chunk-level (product) one.
    action = grad(objective=GIPO(), ratio_granularity="action")
    assert not torch.allclose(action, grads[0]) and not torch.allclose(action, grads[3])


def test_value_loss_gives_the_backbone_no_gradient(collected):
    state, rollout = collected
    m = perturbed(3, state)
    mb = full_batch(m, rollout)
    out = m.evaluate_actions(mb)
    value_loss(values=out.values, returns=mb.returns, valid=mb.valid).backward(retain_graph=True)
    for name, p in m.policy.named_parameters():
        nonzero = p.grad is not None and bool(p.grad.abs().sum() > 0)
        assert nonzero == name.startswith("value_head."), name
    m.zero_grad()
    loss, _ = m.compute_loss(mb, out, None)  # the policy loss does reach the backbone
    loss.backward()
    assert bool(m.policy.backbone.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0)


def test_recompute_values_uses_the_latest_critic_and_the_step(collected):
    state, rollout = collected
    m = module(recompute_values=True)
    m.policy.load_state_dict(state)
    m.policy.eval()
    with torch.no_grad():
        _, _, values = m.compute_advantages(rollout)
        torch.testing.assert_close(values, rollout.values, atol=1e-5, rtol=0)  # same weights: same V
        shifted = Rollout(**{**rollout.__dict__, "step": (rollout.step + 5) * rollout.valid})
        _, _, values_shifted = m.compute_advantages(shifted)
    assert not torch.allclose(values_shifted[rollout.valid], values[rollout.valid])


def test_check_env_spec_names_the_flag():
    m = module()
    spec = EnvSpec.from_env(MetaWorldEnv("reach-v3", image_size=32, proprio_dim=4))
    assert spec.obs_dim == 0 and spec.action_dim == K and spec.continuous
    m.check_env_spec(spec)
    with pytest.raises(ValueError, match="Box action space"):
        m.check_env_spec(EnvSpec(0, 4, False))
    with pytest.raises(ValueError, match="--model.policy.init_args.action_dim=4"):
        m.check_env_spec(EnvSpec(0, 7, True))
    with pytest.raises(ValueError, match="--model.policy.init_args.proprio_dim=4"):
        m.check_env_spec(EnvSpec.from_env(MetaWorldEnv("reach-v3", image_size=32)))
    with pytest.raises(ValueError, match="--model.policy.init_args.image_size=32"):
        m.check_env_spec(EnvSpec.from_env(MetaWorldEnv("reach-v3", proprio_dim=4)))


def test_backbone_from_pretrained_via_cli(tmp_path):
    from fastlight.cli import cli_main
    from fastlight.vla.policy import build_llama

    torch.manual_seed(5)
    saved = build_llama(vocab_size=400, hidden_size=48, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=96)  # fmt: skip
    saved.save_pretrained(tmp_path / "llama")
    cli = cli_main(["--config", os.path.join(ROOT, "configs", "vla_metaworld_reach.yaml"),
                    "--model.policy.init_args.backbone", str(tmp_path / "llama"),
                    "--trainer.default_root_dir", str(tmp_path)], run=False)  # fmt: skip
    backbone = cli.model.policy.backbone
    assert backbone.config.hidden_size == 48 and backbone.config.num_hidden_layers == 1
    torch.testing.assert_close(backbone.get_input_embeddings().weight, saved.get_input_embeddings().weight)
    assert cli.model.hparams.action_dim == K and cli.model.hparams.continuous  # linked from the env


def test_mlp_only_setting_is_refused_instead_of_ignored():
    with pytest.raises(ValueError, match="--model.hidden_sizes sizes RLModule's MLP policy"):
        VLAModule(hidden_sizes=(8,))


def test_default_policy_is_a_vla_policy_built_in_configure_model():
    m = VLAModule(action_dim=3)
    assert not hasattr(m, "policy")  # nothing built in __init__
    m.configure_model()
    assert type(m.policy) is VLAPolicy and m.policy.action_dim == 3  # K = the env's action size
    assert [g["name"] for g in m.configure_optimizers().param_groups] == ["policy", "value_head"]


def test_a_policy_that_is_not_a_token_policy_is_refused_naming_what_it_lacks():
    msg = (
        r"^--model.policy fastlight.models.mlp.MLPActorCritic does not implement "
        r"fastlight.models.base.TokenPolicy, which VLAModule trains \(fastlight.vla.policy.VLAPolicy does\): "
        r"it lacks action_tokenizer, forward, imitation_loss, policy_parameters, value_parameters$"
    )
    with pytest.raises(ValueError, match=msg):
        VLAModule(policy=MLPActorCritic(3, 4, continuous=True))
    from fastlight.cli import cli_main

    mlp = "{class_path: fastlight.models.mlp.MLPActorCritic, init_args: {obs_dim: 3, action_dim: 4}}"
    args = ["--config", os.path.join(ROOT, "configs", "vla_metaworld_reach.yaml"), "--model.policy", mlp]
    with pytest.raises(ValueError, match=msg[1:-1]):  # inside jsonargparse's message
        cli_main(args, run=False)


def vlm_rollout(p: VLAPolicy, ids: torch.Tensor, mask: torch.Tensor, t_len: int = 3) -> Rollout:
    """``t_len`` steps of 2 envs acted by ``p`` on random 32x32 images; both episodes end terminated."""
    g = torch.Generator().manual_seed(0)
    n = t_len * 2
    obs = {
        "image": torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8, generator=g),
        "proprio": torch.randn(n, 4, generator=g),
        "instruction_ids": ids[torch.arange(n) % len(ids)],
        "instruction_mask": mask[torch.arange(n) % len(ids)],
    }
    with torch.no_grad():
        out = p.act(obs)
    term = torch.zeros(t_len, 2, dtype=torch.bool)
    term[-1] = True
    zeros = torch.zeros(t_len, 2)
    return Rollout(
        obs={k: v.reshape(t_len, 2, *v.shape[1:]) for k, v in obs.items()},
        actions=out.actions.reshape(t_len, 2, -1),
        logprobs=out.logprobs.reshape(t_len, 2, -1),
        values=out.values.reshape(t_len, 2),
        rewards=zeros + 1.0,
        terminated=term,
        truncated=torch.zeros_like(term),
        valid=torch.ones_like(term),
        step=torch.arange(t_len)[:, None].expand(t_len, 2).clone(),
        task_id=torch.zeros(t_len, 2, dtype=torch.long),
        policy_version=torch.zeros(t_len, 2, dtype=torch.long),
        bootstrap_values=zeros,
    ).validate()


def test_the_frozen_vision_tower_is_said_once_and_other_eval_modules_still_warn(tmp_path, caplog):
    """A VLM folder's frozen tower stays in eval mode on purpose: one INFO line counts its modules
    and Lightning's eval-mode warning (exactly that count) is left out; a module left in eval mode
    elsewhere (here the value head) still gets Lightning's warning, with both counted."""
    import logging
    import warnings

    from benchmarks.tiny_vlm import save_tiny_vlm
    from tests.instruction_ids import instruction_ids
    from tests.lightning_helpers import quiet_trainer

    sentences = ("reach the goal", "push the puck")
    folder = save_tiny_vlm("llava", tmp_path / "llava", sentences=sentences, n_bins=32)
    ids, mask = instruction_ids(sentences, 6, extra=sentences)

    def fit(value_head_eval: bool) -> tuple[list[str], str, VLAModule]:
        torch.manual_seed(0)
        p = VLAPolicy(backbone=str(folder), n_bins=32, action_dim=K, image_size=32, proprio_dim=4,
                      max_text_len=8, value_mlp_hidden=16)  # fmt: skip
        assert p.bind_instructions(sentences, ids, mask) and p.frozen_modules
        m = VLAModule(policy=p, action_dim=K, **TINY)
        if value_head_eval:
            p.value_head.eval()
        data = DataLoader([vlm_rollout(p, ids, mask)], batch_size=None)
        caplog.clear()
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
            warnings.simplefilter("always")
            filters = list(warnings.filters)
            quiet_trainer(max_epochs=1).fit(m, train_dataloaders=data)
            assert warnings.filters == filters  # the one-check filter is gone after the check
        return [str(w.message) for w in caught if "in eval mode" in str(w.message)], caplog.text, m

    warned, logged, m = fit(value_head_eval=False)
    (tower,) = m.policy.frozen_modules
    n_tower = sum(1 for name, _ in m.policy.named_modules() if name == tower or name.startswith(tower + "."))
    assert n_tower > 10 and m.policy_version == 1
    assert warned == []
    line = f"VLAPolicy: the {n_tower} modules of its frozen {tower} stay in eval mode (freeze_vision: true)"
    assert logged.count(line) == 1 and f"{line}, the only modules in eval mode" in logged
    warned, logged, m = fit(value_head_eval=True)
    n_value = sum(1 for _ in m.policy.value_head.modules())
    assert [w.split(" module(s)")[0] for w in warned] == [f"Found {n_tower + n_value}"]
    others = f"Lightning's eval-mode warning counts them and {n_value} other(s): policy.value_head"
    assert f"{line}; {others}" in logged
