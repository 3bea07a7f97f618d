"""RLModule: SMPO invariance at the module level, settings that change the update, logging."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from fastlight.modules.minibatch import Minibatch
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
    r = Rollout.cat_time([c.collect(policy) for _ in range(3)])
    # Non-trivial rewards so advantages differ between steps.
    return Rollout(**{**r.__dict__, "rewards": torch.randn(r.shape) * r.valid})


def full_batch_loss(module: RLModule, rollout: Rollout) -> tuple[torch.Tensor, list[torch.Tensor]]:
    adv, ret, values = module.compute_advantages(rollout)
    mb = Minibatch.from_rollout(rollout, adv, ret, values)
    loss, _ = module.compute_loss(mb, module.evaluate_actions(mb), None)
    module.zero_grad()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in module.policy.parameters()]


@pytest.mark.parametrize("objective", ["ppo", "gipo", "sapo"])
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
    "objective": "gipo",
    "clip_eps": 0.01,
    "gipo_sigma": 0.05,
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
    if name == "gipo_sigma":
        kwargs["objective"] = "gipo"
        base_g = run_update(**{**base, "objective": "gipo"})
        other = run_update(**kwargs)
        assert any(not torch.equal(base_g[k], other[k]) for k in base_g)
        return
    other = run_update(**kwargs)
    if name == "hidden_sizes":
        assert other["actor.0.weight"].shape == (8, 3)
        return
    assert any(not torch.equal(baseline[k], other[k]) for k in baseline), name


def test_sapo_temperatures_change_the_update():
    a = run_update(objective="sapo", lr=3e-3)
    b = run_update(objective="sapo", lr=3e-3, sapo_tau_pos=3.0, sapo_tau_neg=3.0)
    assert any(not torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"objective": "trpo"}, "--model.objective must be one of ppo | gipo | sapo, got 'trpo'"),
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
