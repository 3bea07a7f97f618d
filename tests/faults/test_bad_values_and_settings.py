"""Non-finite env values are stopped where they enter, naming env, index, seed, step and field;
settings that cannot work are refused before training; resume applies a changed learning rate."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from fastlight.modules.rl_module import RLModule
from fastlight.rollout import Rollout
from fastlight.sampling.collector import Collector
from fastlight.sampling.env_faults import NonFiniteError, is_finite
from tests.fake_envs import FixedLengthEnv


def policy():
    module = RLModule(obs_dim=3, action_dim=2)
    module.configure_model()
    return module.policy


def fault_envs(**kw) -> list[gym.Env]:
    """Two envs made like the samplers make them (gym.make: they carry their id); env 1 is faulty."""
    return [gym.make("Fault-v0", length=50), gym.make("Fault-v0", length=50, **kw)]


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"nan_reward_at": 4}, "reward"),
        ({"nan_obs_at": 4}, "observation"),
        ({"nan_reward_at": 4, "nan_value": float("inf")}, "reward"),
        ({"nan_obs_at": 4, "nan_value": float("-inf")}, "observation"),
    ],
)
@pytest.mark.parametrize("mode", ["dpsa", "autoreset"])
def test_nonfinite_env_value_stops_naming_env_index_seed_step_field(kw, field, mode):
    c = Collector(fault_envs(**kw), mode=mode, max_horizon=20, rollout_steps=20, seed=7)
    with pytest.raises(NonFiniteError) as info:
        c.collect(policy())
    msg = str(info.value)
    assert f"env Fault-v0 (index 1 of this sampler, seed 8) returned a non-finite {field} " in msg
    assert "at episode step 4" in msg


def test_finite_values_pass_and_integer_arrays_are_not_scanned():
    c = Collector(fault_envs(), mode="dpsa", max_horizon=10, seed=0)
    r = c.collect(policy())
    assert r.num_valid == 20 and torch.isfinite(r.rewards).all()
    assert is_finite({"img": torch.zeros(2, 2, dtype=torch.uint8).numpy(), "x": [1.0, 2.0]})
    assert not is_finite({"x": [1.0, float("nan")]})
    assert not is_finite(float("inf"))


def test_more_minibatches_than_a_rollout_can_hold_is_refused():
    from fastlight.data.datamodule import RolloutDataModule

    dm = RolloutDataModule(env_id="tests.fake_envs:Fault-v0", num_envs=2, num_workers=1, max_horizon=5)
    assert dm.max_valid_per_rollout() == 10
    dm.check_minibatches(RLModule(obs_dim=3, action_dim=2, num_minibatches=10))  # the most that can fit
    with pytest.raises(ValueError) as info:
        dm.check_minibatches(RLModule(obs_dim=3, action_dim=2, num_minibatches=1000))
    assert str(info.value) == (
        "--model.num_minibatches must be <= 10, the most valid transitions a Rollout can hold "
        "(--data.num_envs 2 x --data.cycles_per_step 1 x --data.max_horizon 5), got 1000"
    )


def test_a_rollout_with_fewer_valid_steps_than_minibatches_updates_without_crashing():
    torch.manual_seed(0)
    envs = [FixedLengthEnv(lengths=(2,), tag=i) for i in range(2)]
    module = RLModule(obs_dim=3, action_dim=2, update_epochs=2, num_minibatches=8)
    module.configure_model()
    rollout = Collector(envs, mode="dpsa", max_horizon=5).collect(module.policy)
    assert rollout.num_valid == 4 < 8
    steps = []
    module.optimizers = lambda: _Counting(torch.optim.Adam(module.policy.parameters()), steps)
    module.manual_backward = lambda loss: loss.backward()
    module.clip_gradients = lambda *a, **k: None
    before = [p.detach().clone() for p in module.policy.parameters()]
    with torch.no_grad():
        adv, ret, values = module.compute_advantages(rollout)
    infos = module._update(rollout, adv, ret, values)
    assert len(steps) == 2 * 4  # 2 epochs x 4 one-transition minibatches, no empty ones
    assert all(torch.isfinite(v) for v in infos.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, module.policy.parameters(), strict=True))
    empty = Rollout(**{**rollout.__dict__, "valid": torch.zeros_like(rollout.valid)})
    assert module._update(empty, adv, ret, values) == {}  # nothing valid: no update


class _Counting:
    def __init__(self, opt, steps):
        self.opt, self.steps = opt, steps

    def zero_grad(self, **kw):
        self.opt.zero_grad(**kw)

    def step(self):
        self.steps.append(1)
        self.opt.step()


def test_resume_applies_a_changed_learning_rate_to_the_restored_optimizer():
    old = RLModule(obs_dim=3, action_dim=2, lr=5e-4)
    old.configure_model()
    opt = old.configure_optimizers()
    ckpt = {
        "hyper_parameters": dict(old.hparams),
        "optimizer_states": [opt.state_dict()],
    }
    same = RLModule(obs_dim=3, action_dim=2, lr=5e-4)
    same.configure_model()
    same.on_load_checkpoint(ckpt)
    assert ckpt["optimizer_states"][0]["param_groups"][0]["lr"] == 5e-4
    new = RLModule(obs_dim=3, action_dim=2, lr=0.01)
    new.configure_model()
    new.on_load_checkpoint(ckpt)
    assert ckpt["optimizer_states"][0]["param_groups"][0]["lr"] == 0.01


def test_a_sharded_resume_applies_a_changed_learning_rate_to_the_loaded_optimizer():
    """Under fsdp2 the strategy loads the optimizer state in place before the hook, and the checkpoint
    dict has no optimizer_states: the trainer's optimizer itself gets the typed rate."""
    from types import SimpleNamespace

    old = RLModule(obs_dim=3, action_dim=2, lr=5e-4)
    old.configure_model()
    ckpt = {"hyper_parameters": dict(old.hparams)}
    new = RLModule(obs_dim=3, action_dim=2, lr=0.01)
    new.configure_model()
    loaded = new.configure_optimizers()
    for group in loaded.param_groups:
        group["lr"] = 5e-4  # what the sharded load restored
    new._trainer = SimpleNamespace(optimizers=[loaded], precision="32-true")  # attached as under a Trainer
    new.on_load_checkpoint(ckpt)
    assert [g["lr"] for g in loaded.param_groups] == [0.01] * len(loaded.param_groups)


@pytest.mark.parametrize("mode", ["dpsa", "autoreset"])
def test_nonfinite_drop_turns_the_episode_into_padding_and_counts_it(mode):
    # Env 1's 4th step returns NaN: its 4 steps of that episode become padding, env 0 is untouched.
    clean = Collector(fault_envs(), mode=mode, max_horizon=10, rollout_steps=10, termination_threshold=1.0)
    faulty = Collector(
        fault_envs(nan_reward_at=4),
        mode=mode,
        max_horizon=10,
        rollout_steps=10,
        termination_threshold=1.0,
        nonfinite="drop",
    )
    torch.manual_seed(0)
    a = clean.collect(policy())
    torch.manual_seed(0)
    b = faulty.collect(policy())
    assert b.stats.dropped_nonfinite == 1 and a.stats.dropped_nonfinite == 0
    assert torch.isfinite(b.rewards).all() and torch.isfinite(b.obs).all()
    assert torch.equal(b.valid[:, 0], a.valid[:, 0])  # env 0 as before
    assert b.valid[:4, 1].sum() == 0  # the dropped episode's steps are padding
    assert a.valid[:4, 1].all()
    assert not (b.terminated[:4, 1].any() or b.truncated[:4, 1].any())
    if mode == "autoreset":  # env 1 was reset and goes on: a new episode from step 5
        assert b.valid[4:, 1].all() and b.step[4, 1] == 0
    else:  # DPSA: the env has ended for this cycle (dummy steps, its last finite observation)
        assert b.valid[4:, 1].sum() == 0
        assert torch.equal(b.obs[4, 1], b.obs[3, 1])
    assert b.num_valid == a.num_valid - (4 if mode == "autoreset" else 10)


def test_nonfinite_setting_is_checked():
    with pytest.raises(ValueError, match=r"--data.nonfinite must be one of raise \| drop, got 'skip'"):
        Collector(fault_envs(), nonfinite="skip")


def test_nonfinite_setting_reaches_the_samplers():
    from fastlight.data.datamodule import RolloutDataModule

    dm = RolloutDataModule(env_id="tests.fake_envs:Fault-v0", num_envs=2, num_workers=2, nonfinite="drop")
    assert [c.nonfinite for c in dm.sampler_configs(0)] == ["drop", "drop"]
    assert (
        RolloutDataModule(env_id="tests.fake_envs:Fault-v0", num_envs=2).sampler_configs(0)[0].nonfinite
        == "raise"
    )
