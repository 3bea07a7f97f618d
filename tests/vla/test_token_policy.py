"""VLAModule and VLASFTModule train any TokenPolicy, not only VLAPolicy: the user's own VLA class of
examples/hf_vla gets the value-head learning rate, an RL update, self-imitation and SFT; a policy that
lacks part of the protocol is refused in one line naming what it lacks."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from examples.hf_vla.policy import MyVLAPolicy
from fastlight.data.env_spec import EnvSpec
from fastlight.envs.metaworld import MetaWorldEnv
from fastlight.models.base import TokenPolicy
from fastlight.vla.module import VLAModule
from fastlight.vla.sft import VLASFTModule
from tests.lightning_helpers import quiet_trainer
from tests.vla.test_self_imitation import one_success_rollout, success_logprob

N_BINS = 32


def user_policy() -> MyVLAPolicy:
    torch.manual_seed(0)
    return MyVLAPolicy(state_dim=5, action_dim=4, n_bins=N_BINS, hidden=32, layers=1)


def test_the_users_class_is_a_token_policy_with_its_own_value_lr():
    policy = user_policy()
    assert isinstance(policy, TokenPolicy)
    m = VLAModule(policy=policy, action_dim=4, lr=1e-4, value_lr=3e-3)
    groups = m.configure_optimizers().param_groups
    assert [(g["name"], g["lr"]) for g in groups] == [("policy", 1e-4), ("value_head", 3e-3)]
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in policy.vla.parameters()}
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in policy.critic.parameters()}


def sil_run(sil_steps: int, updates: int = 20) -> tuple[VLAModule, L.Trainer]:
    """``updates`` RL updates of the user's policy on the same rollout, each followed by ``sil_steps``
    self-imitation steps."""
    m = VLAModule(policy=user_policy(), action_dim=4, update_epochs=1, num_minibatches=1, lr=1e-3,
                  sil_steps=sil_steps, sil_lr=3e-3, sil_batch_size=64)  # fmt: skip
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(m, train_dataloaders=DataLoader([one_success_rollout()] * updates, batch_size=None))
    return m, trainer


def test_rl_updates_and_self_imitation_train_the_users_policy():
    r = one_success_rollout()  # obs: proprio [5] + instruction_ids [3]; env 0 succeeds after 12 steps
    before = success_logprob(VLAModule(policy=user_policy(), action_dim=4), r)
    critic = [p.detach().clone() for p in user_policy().critic.parameters()]
    m, trainer = sil_run(sil_steps=4)
    assert m.policy_version == 20 and trainer.global_step == 20 * (1 + 4)
    assert m.success_buffer.steps_per_task() == {0: 12 * 20}
    assert all(not torch.equal(a, b) for a, b in zip(critic, m.policy.critic.parameters(), strict=True))
    # ln(1/32) = -3.47 per token at the start; measured -1.62 after the 80 self-imitation steps, and
    # -3.50 after the same updates without them
    after = success_logprob(m, r)
    plain, _ = sil_run(sil_steps=0)
    assert before < -3.3 and after > -2.2 and success_logprob(plain, r) < -3.2, (before, after)


def test_sft_fits_the_users_policy_to_demonstrations():
    g = torch.Generator().manual_seed(1)
    n = 32
    batch = {
        "obs": {"proprio": torch.randn(n, 5, generator=g), "instruction_ids": torch.full((n, 3), 7)},
        "actions": torch.rand(n, 4, generator=g) * 2 - 1,
    }
    m = VLASFTModule(policy=user_policy(), action_dim=4, lr=3e-3, warmup_steps=1)
    first, _ = m.token_loss(batch)
    assert abs(first.item() - math.log(N_BINS)) < 0.3  # a fresh head is near uniform over the bins
    trainer = quiet_trainer(max_steps=150)
    trainer.fit(m, train_dataloaders=DataLoader([batch] * 150, batch_size=None))
    logged = trainer.callback_metrics
    assert trainer.global_step == 150 and m.policy_version == 0
    # measured: loss 0.28, token accuracy 0.98 (from ln 32 = 3.47 and 1/32)
    assert float(logged["sft/loss"]) < 1.0 and float(logged["sft/token_accuracy"]) > 0.8, dict(logged)


def test_check_env_spec_calls_the_policys_own_observation_check():
    m = VLAModule(policy=user_policy(), action_dim=4)
    m.check_env_spec(EnvSpec.from_env(MetaWorldEnv("reach-v3", image=False, proprio_dim=5)))
    with pytest.raises(ValueError, match=r"^--model.policy.init_args.state_dim=5, the env's state is 39$"):
        m.check_env_spec(EnvSpec.from_env(MetaWorldEnv("reach-v3", image=False)))
    with pytest.raises(ValueError, match=r"--model.policy.init_args.action_dim=4 .* action size 7"):
        m.check_env_spec(EnvSpec(0, 7, True))


class ActsOnly(nn.Module):
    """The Policy methods and a forward, but no tokenizer, no actor / critic split."""

    action_dim = 4

    def forward(self, obs, actions=None):
        return obs, None

    act = evaluate = value = action_mapping = env_action = forward


def test_a_policy_missing_token_members_is_refused_naming_them():
    want = (
        r"^--model.policy tests.vla.test_token_policy.ActsOnly does not implement "
        r"fastlight.models.base.TokenPolicy, which VLAModule trains \(fastlight.vla.policy.VLAPolicy does\): "
        r"it lacks action_tokenizer, imitation_loss, policy_parameters, value_parameters$"
    )
    with pytest.raises(ValueError, match=want):
        VLAModule(policy=ActsOnly(), action_dim=4)
