"""Where the policy comes from: built by ``configure_model`` (``build_policy``) or injected
(``policy=``, ``--model.policy``); what the checkpoint records so that it can be rebuilt."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from fastlight.data.datamodule import EnvSpec
from fastlight.models.mlp import MLPActorCritic
from fastlight.modules.rl_module import RLModule
from tests.lightning_helpers import quiet_trainer, wait_no_children
from tests.modules.test_rl_module import sample_rollout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class WideModule(RLModule):
    """A subclass written the natural way: ``super().__init__`` first, then its own attribute."""

    def __init__(self, width: int = 16, **kwargs) -> None:
        super().__init__(**kwargs)
        self.width = width

    def build_policy(self) -> nn.Module:
        h = self.hparams
        return MLPActorCritic(h.obs_dim, h.action_dim, hidden_sizes=(self.width,))


def fit_one_rollout(module: RLModule, tmp_path) -> str:
    """One training step on a fixed rollout; returns the path of the checkpoint written after it."""
    version = module.policy_version
    trainer = quiet_trainer(max_epochs=1, default_root_dir=tmp_path)
    trainer.fit(module, train_dataloaders=DataLoader([sample_rollout()], batch_size=None))
    assert module.policy_version == version + 1
    path = os.path.join(tmp_path, "m.ckpt")
    trainer.save_checkpoint(path)
    return path


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_natural_subclass_builds_its_policy_in_configure_model(tmp_path):
    module = WideModule(width=8, obs_dim=3, action_dim=2)
    # No policy before configure_model: a clear message, and hasattr stays a plain False.
    with pytest.raises(AttributeError, match=r"WideModule.policy does not exist yet: .*configure_model\(\)"):
        module.policy  # noqa: B018
    assert not hasattr(module, "policy")
    ckpt = fit_one_rollout(module, tmp_path)  # the Trainer calls configure_model
    policy = module.policy
    assert policy.actor[0].weight.shape == (8, 3)  # build_policy read the attribute set after super()
    module.configure_model()  # idempotent: Lightning may call it again
    assert module.policy is policy
    loaded = WideModule.load_from_checkpoint(ckpt)  # calls configure_model, then loads the weights
    assert loaded.hparams.width == 8 and loaded.width == 8
    assert same_weights(loaded.policy, policy) and loaded.policy_version == 1


def test_injected_policy_object_is_used_and_not_pickled_into_hparams(tmp_path):
    torch.manual_seed(0)
    policy = MLPActorCritic(3, 2, hidden_sizes=(5,))
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    module = RLModule(policy=policy, update_epochs=1, num_minibatches=1)  # no obs_dim needed
    assert module.policy is policy  # usable at once
    module.configure_model()
    assert module.policy is policy  # configure_model keeps an injected policy
    ckpt = fit_one_rollout(module, tmp_path)
    assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())  # it trained
    hparams = torch.load(ckpt, weights_only=True)["hyper_parameters"]  # plain data: no module inside
    assert hparams["policy"] == "fastlight.models.mlp.MLPActorCritic"
    with pytest.raises(
        ValueError, match=r"pass it again, e.g. load_from_checkpoint\(path, policy=MLPActorCritic"
    ):
        RLModule.load_from_checkpoint(ckpt)
    loaded = RLModule.load_from_checkpoint(ckpt, policy=MLPActorCritic(3, 2, hidden_sizes=(5,)))
    assert same_weights(loaded.policy, policy)


def test_injected_policy_sizes_are_checked_against_the_env_naming_its_flag():
    module = RLModule(policy=MLPActorCritic(4, 2))
    with pytest.raises(
        ValueError, match="--model.policy.init_args.obs_dim=4 does not match the env's obs_dim=3"
    ):
        module.check_env_spec(EnvSpec(3, 2, False))
    default = RLModule(obs_dim=4, action_dim=2)
    default.configure_model()
    with pytest.raises(ValueError, match="--model.obs_dim=4 does not match"):
        default.check_env_spec(EnvSpec(3, 2, False))


def test_mlp_setting_with_an_injected_policy_is_refused():
    with pytest.raises(
        ValueError, match="--model.hidden_sizes sizes the default MLP policy and has no effect"
    ):
        RLModule(policy=MLPActorCritic(3, 2), hidden_sizes=(8,))


@pytest.mark.multiproc
def test_cli_policy_injection_builds_and_reloads_that_policy(tmp_path):
    from fastlight.cli import cli_main

    cli = cli_main(
        [
            "fit",
            "--config",
            os.path.join(ROOT, "configs", "highway_dpsa.yaml"),
            "--data.env_id",
            "tests.fake_envs:TwoTask-v0",
            "--data.reset_mode",
            "autoreset",
            "--data.rollout_steps",
            "6",
            "--data.num_envs",
            "2",
            "--data.num_workers",
            "1",
            "--data.steps_per_epoch",
            "1",
            "--model.update_epochs",
            "1",
            "--model.num_minibatches",
            "1",
            "--trainer.max_steps",
            "1",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--model.policy.class_path",
            "examples.merge_module.LayerNormMLP",
            "--model.policy.init_args.obs_dim",
            "3",
            "--model.policy.init_args.action_dim",
            "2",
            "--model.policy.init_args.hidden_sizes",
            "[16]",
        ]
    )
    from examples.merge_module import LayerNormMLP

    policy = cli.model.policy
    assert type(policy) is LayerNormMLP and policy.actor[0].weight.shape == (16, 3)
    assert cli.model.policy_version == 1  # it trained
    recorded = cli.model.hparams.policy  # the CLI config, not the object
    assert recorded["class_path"] == "examples.merge_module.LayerNormMLP"
    assert recorded["init_args"]["hidden_sizes"] == [16]
    ckpt = os.path.join(tmp_path, "m.ckpt")
    cli.trainer.save_checkpoint(ckpt)
    loaded = RLModule.load_from_checkpoint(ckpt)  # the CLI's instantiator rebuilds the injected policy
    assert type(loaded.policy) is LayerNormMLP and same_weights(loaded.policy, policy)
    assert loaded.hparams.policy == recorded  # kept, so a checkpoint of the reloaded module works too
    again = RLModule.load_from_checkpoint(fit_one_rollout(loaded, tmp_path / "again"))
    assert type(again.policy) is LayerNormMLP and same_weights(again.policy, loaded.policy)
    wait_no_children()
