"""RLModule's observation / return normalisation: when it is on, what updates it (valid steps only,
after the update for observations, before it for returns), the loss's units, and that the numbers
travel with the weights and the checkpoint."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fastlight.models.normalization import NormalizedPolicy
from fastlight.modules.rl_module import RLModule
from fastlight.rollout import Rollout
from fastlight.sampling.collector import Collector
from fastlight.weights.shared_memory import SharedWeights
from tests.fake_envs import ActionEchoEnv
from tests.lightning_helpers import quiet_trainer


def built(**kw) -> RLModule:
    module = RLModule(**kw)
    module.configure_model()
    return module


@pytest.mark.parametrize(
    "kw, expect",
    [
        ({"obs_dim": 6, "action_dim": 2, "continuous": True}, (True, True)),  # MuJoCo-style: on
        ({"obs_dim": 6, "action_dim": 2, "continuous": False}, (False, False)),  # highway-style: off
        ({"obs_dim": 6, "action_dim": 2, "continuous": True, "normalize_obs": False}, (False, True)),
        ({"obs_dim": 6, "action_dim": 2, "normalize_returns": True}, (False, True)),
    ],
)
def test_defaults_and_settings(kw, expect):
    module = built(**kw)
    assert module.normalization() == expect
    wrapped = isinstance(module.policy, NormalizedPolicy)
    assert wrapped == any(expect)
    if wrapped:
        assert (module.policy.obs_rms is not None, module.policy.ret_rms is not None) == expect
        assert module.core_policy is module.policy.policy


def rollout(seed: int) -> Rollout:
    torch.manual_seed(seed)
    envs = [ActionEchoEnv(kind="vector", action_dim=2, length=n) for n in (3, 5, 8, 4)]
    policy = built(obs_dim=6, action_dim=2, continuous=True).policy
    r = Collector(envs, mode="dpsa", termination_threshold=0.5, max_horizon=8).collect(policy)
    # Scaled observations and rewards, so the statistics are far from (0, 1).
    return Rollout(
        **{**r.__dict__, "obs": r.obs * 40 + 3, "rewards": (torch.randn(r.shape) * 50 + 10) * r.valid}
    )


def test_a_training_step_updates_the_statistics_from_valid_steps_only():
    torch.manual_seed(0)
    module = built(obs_dim=6, action_dim=2, continuous=True)
    r = rollout(1)
    junk = Rollout(
        **{**r.__dict__, "obs": torch.where(r.valid[..., None], r.obs, torch.full_like(r.obs, 1e6))}
    )
    with torch.no_grad():
        _, ret, _ = module.compute_advantages(junk)  # the targets this update learns
    module = built(obs_dim=6, action_dim=2, continuous=True)
    trainer = quiet_trainer(max_steps=module.optimizer_steps_per_update)
    trainer.fit(module, train_dataloaders=DataLoader([junk], batch_size=None))
    obs_rms, ret_rms = module.policy.obs_rms, module.policy.ret_rms
    valid_obs = r.obs[r.valid].double().numpy()
    np.testing.assert_allclose(obs_rms.mean.numpy(), valid_obs.mean(0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(obs_rms.var.numpy(), valid_obs.var(0), rtol=1e-9, atol=1e-9)
    assert float(obs_rms.count) == int(r.valid.sum())
    # Returns: GAE's targets of the valid steps (the fresh critic's values are in return units).
    valid_ret = ret[r.valid].double().numpy()
    np.testing.assert_allclose(float(ret_rms.mean), valid_ret.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(ret_rms.var), valid_ret.var(), rtol=1e-5)


def test_value_loss_is_in_units_of_the_return_std():
    """Scaling every reward by 100 leaves the value loss of a matching critic unchanged."""
    from fastlight.modules.minibatch import Minibatch

    r = rollout(2)
    losses = []
    for scale in (1.0, 100.0):
        torch.manual_seed(3)
        module = built(obs_dim=6, action_dim=2, continuous=True)
        scaled = Rollout(**{**r.__dict__, "rewards": r.rewards * scale, "values": r.values * scale,
                            "bootstrap_values": r.bootstrap_values * scale})  # fmt: skip
        with torch.no_grad():
            adv, ret, values = module.compute_advantages(scaled)
        # The critic's outputs in return units scale with the return std the update just measured.
        mb = Minibatch.from_rollout(scaled, adv, ret, values)
        _, info = module.compute_loss(mb, module.evaluate_actions(mb), None)
        losses.append(float(info["value"]))
    # Return std scales by 100 exactly, the critic's normalised output is the same, the mean scales
    # too: the loss is the same up to float32 rounding.
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)


def test_statistics_travel_with_the_weights_and_the_checkpoint(tmp_path):
    module = built(obs_dim=6, action_dim=2, continuous=True)
    r = rollout(4)
    module.policy.update_obs(r.obs, r.valid)
    module.policy.update_returns(r.rewards, r.valid)
    # The samplers' copy: the shared-memory publication carries the buffers.
    shared = SharedWeights(module.policy, multiprocessing.get_context("spawn"))
    shared.publish(module.policy, version=1)
    copy = built(obs_dim=6, action_dim=2, continuous=True).policy
    assert float(copy.obs_rms.count) == 0
    shared.load_into(copy)
    for name in ("obs_rms.mean", "obs_rms.var", "obs_rms.count", "ret_rms.mean", "ret_rms.var"):
        # The shared buffer is float32: the float64 statistics arrive rounded to it.
        mine, theirs = copy.state_dict()[name], module.policy.state_dict()[name]
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-6)
    # And the checkpoint: a fitted module's statistics come back with load_from_checkpoint.
    trainer = quiet_trainer(max_steps=module.optimizer_steps_per_update)
    trainer.fit(module, train_dataloaders=DataLoader([r], batch_size=None))
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    loaded = RLModule.load_from_checkpoint(path)
    assert isinstance(loaded.policy, NormalizedPolicy)
    torch.testing.assert_close(loaded.policy.obs_rms.mean, module.policy.obs_rms.mean, rtol=0, atol=0)
    x = r.obs[0]
    torch.testing.assert_close(loaded.policy.value(x), module.policy.value(x), rtol=0, atol=0)
