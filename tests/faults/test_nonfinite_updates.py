"""Non-finite losses and gradients skip the optimizer step (weights and Adam state untouched),
are counted as ``faults/skipped_updates``, and stop the run after ``max_nonfinite_updates`` in a
row naming loss or gradient and the step; a NaN reset under ``--data.nonfinite drop`` is dropped."""

from __future__ import annotations

import contextlib
import copy

import gymnasium as gym
import pytest
import torch

from fastlight.modules.rl_module import RLModule
from fastlight.sampling.collector import Collector
from fastlight.sampling.env_faults import NonFiniteError
from fastlight.sampling.resets import RESET_RETRIES
from tests.faults.test_preemption import Rollouts
from tests.lightning_helpers import quiet_trainer


class PoisonedLoss(RLModule):
    """Makes the loss (``where="loss"``) or one gradient (``"grad"``) NaN at the given optimizer steps."""

    def __init__(self, bad_steps: set[int], where: str = "loss", **kw) -> None:
        super().__init__(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=2, **kw)
        self.bad_steps, self.where = bad_steps, where
        self.snapshots: dict[int, tuple[list[torch.Tensor], dict]] = {}

    def compute_loss(self, mb, out, count):
        loss, info = super().compute_loss(mb, out, count)
        opt = self.optimizers().optimizer
        params = [p.detach().clone() for p in self.policy.parameters()]
        self.snapshots[self.global_step] = (params, copy.deepcopy(opt.state_dict()))
        if self.global_step in self.bad_steps:
            if self.where == "loss":
                loss = loss * float("nan")
            else:
                first = next(self.policy.parameters())
                first.register_hook(lambda g: torch.full_like(g, float("inf")))
        return loss, info

    def on_train_batch_end(self, outputs, batch, batch_idx):
        for p in self.policy.parameters():
            p._backward_hooks = None  # one poisoned backward only
        return super().on_train_batch_end(outputs, batch, batch_idx)


def run(model: RLModule, steps: int) -> None:
    quiet_trainer(max_steps=steps).fit(model, train_dataloaders=torch.utils.data.DataLoader(
        Rollouts(steps), batch_size=None))


@pytest.mark.parametrize("where", ["loss", "grad"])
def test_a_nonfinite_step_is_skipped_counted_and_training_goes_on(where):
    torch.manual_seed(0)
    model = PoisonedLoss({3}, where=where)
    run(model, 6)
    assert model.global_step == 6 and model.skipped_updates == 1  # Lightning still counts the step
    assert all(torch.isfinite(p).all() for p in model.policy.parameters())
    # The skipped step changed nothing: step 4 starts from the weights and Adam state step 3 saw
    # (bitwise: nothing ran on them), while a step that was taken (2 -> 3) moved them.
    (before, state_before), (after, state_after) = model.snapshots[3], model.snapshots[4]
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(model.snapshots[2][0], before, strict=True))
    for k, v in state_before["state"].items():
        assert all(torch.equal(v[n], state_after["state"][k][n]) for n in v)
    assert float(state_after["state"][0]["step"]) == 3  # Adam's step count did not move either


def test_too_many_nonfinite_steps_in_a_row_stop_naming_loss_and_step():
    model = PoisonedLoss({2, 3}, max_nonfinite_updates=2)
    with pytest.raises(FloatingPointError) as info:
        run(model, 8)
    msg = str(info.value)
    assert msg.startswith("non-finite loss at optimizer step 3 (update 1, epoch 0, minibatch 1): ")
    assert "2 optimizer steps in a row skipped (--model.max_nonfinite_updates 2)" in msg
    assert all(torch.isfinite(p).all() for p in model.policy.parameters())


def test_nonfinite_check_off_lets_the_nan_through():
    model = PoisonedLoss({1}, max_nonfinite_updates=0)
    run(model, 2)
    assert model.skipped_updates == 0
    assert not all(torch.isfinite(p).all() for p in model.policy.parameters())


def test_bad_max_nonfinite_updates_is_refused():
    with pytest.raises(ValueError, match="--model.max_nonfinite_updates must be >= 0, got -1"):
        RLModule(obs_dim=3, action_dim=2, max_nonfinite_updates=-1)


def nan_reset_envs(nan_reset_at: int) -> list[gym.Env]:
    return [gym.make("Fault-v0", length=3), gym.make("Fault-v0", length=3, nan_reset_at=nan_reset_at)]


def test_nan_reset_is_dropped_and_reset_again_under_drop():
    module = RLModule(obs_dim=3, action_dim=2)
    module.configure_model()
    c = Collector(nan_reset_envs(2), mode="dpsa", max_horizon=5, seed=3, nonfinite="drop")
    first = c.collect(module.policy)
    second = c.collect(module.policy)  # env 1's second reset returns NaN: dropped, reset again
    assert first.stats.dropped_nonfinite == 0 and second.stats.dropped_nonfinite == 1
    assert torch.isfinite(second.obs).all() and second.valid[:, 1].sum() == 3
    # Under "raise" the same reset stops the run, naming the env and the field.
    c = Collector(nan_reset_envs(1), mode="dpsa", max_horizon=5, seed=3)
    with pytest.raises(NonFiniteError, match=r"index 1 of this sampler, seed 4\) returned a non-finite "
                       r"observation \(from reset\) at episode step 0"):
        c.collect(module.policy)


def test_an_env_that_never_resets_cleanly_stops_even_under_drop():
    class AlwaysNaN(gym.Wrapper):
        def reset(self, **kw):
            obs, info = self.env.reset(**kw)
            return obs * float("nan"), info

    module = RLModule(obs_dim=3, action_dim=2)
    module.configure_model()
    c = Collector([AlwaysNaN(gym.make("Fault-v0"))], mode="dpsa", max_horizon=5, nonfinite="drop")
    with pytest.raises(NonFiniteError, match=rf"observation \(from {RESET_RETRIES + 1} resets in a row\)"):
        c.collect(module.policy)


@pytest.mark.parametrize(
    ("grads", "skipped"),
    [
        # huge but finite, mixed dtypes, an empty gradient
        ([torch.full((3,), 3e38), torch.ones(2, dtype=torch.bfloat16), torch.zeros(0)], False),
        ([torch.ones(3), torch.tensor([1.0, float("inf")], dtype=torch.bfloat16)], True),
        ([torch.tensor([float("nan"), 1.0]), torch.ones(2)], True),
        ([torch.ones(2), torch.tensor([-float("inf")])], True),
    ],
)
def test_the_gradient_check_flags_exactly_the_nonfinite_elements(grads, skipped):
    """One max-abs norm per gradient decides: it is finite exactly when every element is, whatever
    the dtypes (mixed here) and however large the finite values."""
    from fastlight.modules.nonfinite import NonfiniteSteps

    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    check = NonfiniteSteps(limit=3)
    with pytest.warns(UserWarning, match="non-finite gradient") if skipped else contextlib.nullcontext():
        check.check(torch.optim.SGD(params, lr=0.1), torch.tensor(1.0), params, world_size=1, at=(0, 0, 0, 0))
    assert check.skipped == int(skipped)
    assert all(p.grad is None for p in params) == skipped
