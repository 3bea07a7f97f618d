"""RLModule: SMPO invariance at the module level, settings that change the update, logging."""

from __future__ import annotations

import copy
import re

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from fastlight.losses import gipo_loss, ppo_clip_loss, sapo_loss, value_loss
from fastlight.losses.masked import masked_mean
from fastlight.losses.ratios import policy_terms, ratio_diagnostics
from fastlight.modules.minibatch import Minibatch
from fastlight.modules.objectives import GIPO, SAPO, Objective, PPOClip
from fastlight.modules.rl_module import RLModule
from fastlight.rollout import Rollout
from fastlight.sampling.collector import Collector
from tests.fake_envs import FixedLengthEnv


def built(module: RLModule) -> RLModule:
    """The module with its policy, as the Trainer's configure_model leaves it."""
    module.configure_model()
    return module


def sample_rollout(seed: int = 0) -> Rollout:
    torch.manual_seed(seed + 100)  # behaviour policy != the module's fresh critic
    envs = [FixedLengthEnv(lengths=(3, 7, 2, 9), tag=i) for i in range(4)]
    policy = built(RLModule(obs_dim=3, action_dim=2)).policy
    c = Collector(envs, mode="dpsa", termination_threshold=0.5, max_horizon=8)
    r = Rollout.cat([c.collect(policy) for _ in range(3)], dim=0)
    # Non-trivial rewards so advantages differ between steps.
    return Rollout(**{**r.__dict__, "rewards": torch.randn(r.shape) * r.valid})


def full_batch_loss(module: RLModule, rollout: Rollout) -> tuple[torch.Tensor, list[torch.Tensor]]:
    adv, ret, values = module.compute_advantages(rollout)
    mb = Minibatch.from_rollout(rollout, adv, ret, values)
    loss, _ = module.compute_loss(mb, module.evaluate_actions(mb), None)
    module.zero_grad()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in module.policy.parameters()]


@pytest.mark.parametrize("objective", [PPOClip(), GIPO(), SAPO()], ids=repr)
def test_smpo_padding_changes_nothing_in_the_module(objective):
    """Appending padded steps with garbage values leaves loss and every gradient unchanged."""
    torch.manual_seed(1)
    module = built(RLModule(obs_dim=3, action_dim=2, objective=objective))
    r = sample_rollout()
    with torch.no_grad():  # move the policy off the behaviour policy so ratios != 1
        for p in module.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    loss, grads = full_batch_loss(module, r)
    t_len, n_env = r.shape
    padded = Rollout.cat([r.pad_to(t_len + 5), r.pad_to(t_len + 5).map(torch.zeros_like)])
    garbage = ~padded.valid
    for name in ("rewards", "values", "logprobs", "bootstrap_values"):
        getattr(padded, name)[garbage] = torch.randn(int(garbage.sum())) * 1e3
    padded.obs[garbage] = torch.randn(int(garbage.sum()), 3) * 1e3
    padded.actions[garbage] = 1
    loss_p, grads_p = full_batch_loss(module, padded)
    torch.testing.assert_close(loss_p, loss, atol=1e-6, rtol=0)
    for g, gp in zip(grads, grads_p, strict=True):
        torch.testing.assert_close(gp, g, atol=1e-6, rtol=0)


def run_update(seed: int = 0, **kwargs) -> dict[str, torch.Tensor]:
    """One Lightning training step on a fixed rollout; returns the resulting policy weights."""
    torch.manual_seed(seed)
    module = RLModule(obs_dim=3, action_dim=2, **kwargs)
    rollout = sample_rollout()
    L.seed_everything(seed)
    trainer = L.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(module, train_dataloaders=DataLoader([rollout], batch_size=None, collate_fn=None))
    assert module.policy_version == 1
    return copy.deepcopy(module.policy.state_dict())


SETTINGS = {
    "lr": 1e-2,
    "gamma": 0.5,
    "gae_lambda": 0.5,
    "update_epochs": 2,
    "num_minibatches": 1,
    "objective": GIPO(),
    "vf_coef": 2.0,
    "ent_coef": 0.5,
    "value_clip_eps": 0.01,
    "max_grad_norm": 0.001,
    "normalize_advantages": False,
    "recompute_values": True,
    "hidden_sizes": (8,),
}


@pytest.fixture(scope="module")
def baseline():
    # Baseline with an aggressive learning rate so that later epochs see ratios away from 1.
    return run_update(lr=3e-3, update_epochs=2)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_setting_changes_the_update(name, baseline):
    base = {"lr": 3e-3, "update_epochs": 2}
    kwargs = {**base, name: SETTINGS[name]}
    if name == "update_epochs":
        kwargs[name] = 3
    other = run_update(**kwargs)
    if name == "hidden_sizes":
        assert other["actor.0.weight"].shape == (8, 3)
        return
    assert any(not torch.equal(baseline[k], other[k]) for k in baseline), name


@pytest.mark.parametrize(
    ("default", "changed"),
    [
        (PPOClip(), PPOClip(clip_eps=0.01)),
        (GIPO(), GIPO(sigma=0.05)),
        (SAPO(), SAPO(tau_pos=3.0)),
        (SAPO(), SAPO(tau_neg=3.0)),
    ],
    ids=repr,
)
def test_every_objective_setting_changes_the_update(default, changed):
    a = run_update(objective=default, lr=3e-3)
    b = run_update(objective=changed, lr=3e-3)
    assert any(not torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"ratio_granularity": "word"}, "--model.ratio_granularity must be one of token | action | chunk"),
        ({"num_minibatches": 0}, "--model.num_minibatches must be >= 1"),
        ({"gamma": 1.5}, r"--model.gamma must be in \[0, 1\]"),
        ({"obs_dim": 0}, "--model.obs_dim and --model.action_dim must be >= 1"),
    ],
)
def test_bad_model_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RLModule(**{"obs_dim": 3, "action_dim": 2, **kwargs})


def test_training_step_logs_ppo_diagnostics():
    module = RLModule(obs_dim=3, action_dim=2)
    trainer = L.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(module, train_dataloaders=DataLoader([sample_rollout()], batch_size=None))
    logged = trainer.logged_metrics
    for key in (
        "loss/approx_kl",
        "loss/clip_frac",
        "loss/explained_variance",
        "loss/entropy",
        "loss/policy",
        "loss/value",
        "rollout/return",
        "rollout/episode_length",
        "rollout/policy_lag",
    ):
        assert key in logged, key
    assert logged["rollout/policy_lag"] == 0
    assert 0 <= logged["loss/clip_frac"] <= 1
    assert logged["loss/entropy"] > 0.5  # near log 2 for a fresh 2-action policy


def perturbed_minibatch(module: RLModule) -> tuple[Minibatch, object]:
    """A full-batch minibatch of a fixed rollout, and the module's outputs on it (ratios != 1)."""
    built(module)
    with torch.no_grad():
        for p in module.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(5)))
    r = sample_rollout()
    adv, ret, values = module.compute_advantages(r)
    mb = Minibatch.from_rollout(r, adv, ret, values)
    return mb, module.evaluate_actions(mb)


@pytest.mark.parametrize(
    ("objective", "pure", "args"),
    [
        (PPOClip(clip_eps=0.1), ppo_clip_loss, {"clip_eps": 0.1}),
        (GIPO(sigma=0.2, clip_frac_eps=0.1), gipo_loss, {"sigma": 0.2, "clip_eps": 0.1}),
        (
            SAPO(tau_pos=0.7, tau_neg=1.3, clip_frac_eps=0.1),
            sapo_loss,
            {"tau_pos": 0.7, "tau_neg": 1.3, "clip_eps": 0.1},
        ),
    ],
    ids=["ppo", "gipo", "sapo"],
)
def test_compute_loss_is_the_pure_loss_of_the_objective(objective, pure, args):
    """The object path gives bit-identical numbers to the pure function with the same settings."""
    torch.manual_seed(0)
    module = RLModule(obs_dim=3, action_dim=2, objective=objective, vf_coef=0.7, ent_coef=0.1)
    mb, out = perturbed_minibatch(module)
    loss, info = module.compute_loss(mb, out, None)
    inputs = {"logprobs": out.logprobs, "old_logprobs": mb.logprobs, "advantages": mb.advantages}
    pg, pure_info = pure(**inputs, valid=mb.valid, **args)
    vl = value_loss(values=out.values, returns=mb.returns, valid=mb.valid, old_values=mb.values)
    ent = masked_mean(out.entropy, mb.valid)
    assert 0 < float(pure_info["clip_frac"]) < 1  # the setting is in play
    assert torch.equal(info["policy"], pg.detach())
    for key, value in pure_info.items():  # approx_kl, clip_frac, ratio_mean (+ GIPO's trust_weight_mean)
        assert torch.equal(info[key], value), key
    torch.testing.assert_close(loss, pg + 0.7 * vl - 0.1 * ent, rtol=0, atol=1e-7)


class ScaledPG(Objective):
    """A user's objective, defined outside fastlight: ``scale x`` the plain policy gradient ``-r·A``."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.calls = 0

    def loss(self, *, logprobs, old_logprobs, advantages, valid, granularity, tokens_per_action, count):
        self.calls += 1
        log_r, adv = policy_terms(
            logprobs=logprobs,
            old_logprobs=old_logprobs,
            advantages=advantages,
            valid=valid,
            granularity=granularity,
            tokens_per_action=tokens_per_action,
        )
        info = ratio_diagnostics(log_r=log_r.detach(), valid=valid, clip_eps=0.2, count=count)
        return self.scale * masked_mean(-log_r.exp() * adv, valid, count=count), info


def test_a_users_objective_needs_no_edit_of_the_module():
    torch.manual_seed(0)
    module = RLModule(obs_dim=3, action_dim=2, objective=ScaledPG(scale=3.0))
    mb, out = perturbed_minibatch(module)
    _, info = module.compute_loss(mb, out, None)
    log_r = out.logprobs - mb.logprobs
    expected = -3.0 * (log_r.exp() * mb.advantages)[mb.valid].mean()
    torch.testing.assert_close(info["policy"], expected.detach(), rtol=1e-6, atol=0)
    assert module.hparams.objective == {"class_path": f"{__name__}.ScaledPG", "init_args": {"scale": 3.0}}
    # Through a training step: the objective is called once per minibatch, and with scale 0 (and no
    # value / entropy terms) the actor does not move, where PPOClip's would.
    frozen = ScaledPG(scale=0.0)
    common = {"vf_coef": 0.0, "ent_coef": 0.0, "update_epochs": 2, "num_minibatches": 3, "lr": 1e-2}
    torch.manual_seed(0)
    start = built(RLModule(obs_dim=3, action_dim=2)).policy.state_dict()
    after = run_update(objective=frozen, **common)
    assert frozen.calls == 6
    actor = [k for k in start if k.startswith("actor")]
    assert actor and all(torch.equal(after[k], start[k]) for k in actor)
    ppo = run_update(objective=PPOClip(), **common)
    assert any(not torch.equal(ppo[k], start[k]) for k in actor)


def test_grpo_advantage_needs_groups_and_logs_the_informative_share():
    """--model.advantage grpo: refused without --data.group_size >= 2; with groups, each clip's advantage
    is its return against its group's, and the share of groups that differ is logged."""
    import lightning as L

    from fastlight.rollout import Rollout

    with pytest.raises(ValueError, match=re.escape("one of gae | grpo | group_steps, got 'grpo2'")):
        RLModule(obs_dim=3, action_dim=2, advantage="grpo2")
    m = RLModule(obs_dim=3, action_dim=2, advantage="grpo")
    m.configure_model()
    t_len, n_env = 4, 4
    valid = torch.ones(t_len, n_env, dtype=torch.bool)
    done = torch.zeros(t_len, n_env, dtype=torch.bool)
    done[-1] = True
    rewards = torch.tensor([[1.0, 0.0, 2.0, 2.0]]).expand(t_len, n_env).clone()
    rollout = Rollout(
        obs=torch.zeros(t_len, n_env, 3), actions=torch.zeros(t_len, n_env, dtype=torch.long),
        logprobs=torch.zeros(t_len, n_env), values=torch.zeros(t_len, n_env), rewards=rewards,
        terminated=done, truncated=torch.zeros_like(done), valid=valid,
        bootstrap_values=torch.zeros(t_len, n_env), step=torch.zeros(t_len, n_env, dtype=torch.long),
        task_id=torch.zeros(t_len, n_env, dtype=torch.long),
        policy_version=torch.zeros(t_len, n_env, dtype=torch.long),
    )  # fmt: skip
    with pytest.raises(ValueError, match="set --data.group_size to 2 or more"):
        m.compute_advantages(rollout)

    class Grouped(L.LightningDataModule):
        group_size = 2

    m.trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    m.trainer.datamodule = Grouped()
    adv, _, _ = m.compute_advantages(rollout)
    # returns 4 vs 0 (group 1) and 8 vs 8 (group 2: no signal)
    torch.testing.assert_close(adv[:, :2], torch.tensor([[1.0, -1.0]]).expand(t_len, 2), rtol=0, atol=1e-5)
    assert bool((adv[:, 2:] == 0).all()) and float(m._informative_groups) == 0.5
    # group_steps: each step's reward-to-go against the other clip's at that step, then normalised
    m.hparams.advantage = "group_steps"
    adv, _, _ = m.compute_advantages(rollout)
    assert bool((adv[:, 0] > 0).all()) and bool((adv[:, 1] < 0).all()) and float(m._informative_groups) == 0.5
    torch.testing.assert_close(
        adv[:, 2:], torch.full((t_len, 2), float(adv[:, 2:].mean())), rtol=0, atol=1e-6
    )
