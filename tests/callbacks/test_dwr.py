"""Dynamic Weighted Resampling: the formula, the window, checkpoints, and the push to samplers."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from fastlight.callbacks.dwr import DynamicWeightedResampling, dwr_weights
from fastlight.data.datamodule import RolloutDataModule
from fastlight.modules.rl_module import RLModule


def test_weights_match_the_formula_on_a_hand_built_history():
    dwr = DynamicWeightedResampling(num_tasks=3, window=4, eps=1.0)
    # task 0: 3 failures, task 1: 1 failure, task 2: 0 failures
    dwr.record([0, 0, 0, 1, 1, 2, 2], [False, False, False, True, False, True, True])
    expected = torch.tensor([3 + 1.0, 1 + 1.0, 0 + 1.0], dtype=torch.float64) / 7.0
    torch.testing.assert_close(dwr.weights(), expected, rtol=0, atol=1e-12)


def test_always_failing_task_gets_the_largest_weight_and_mastered_keeps_eps():
    dwr = DynamicWeightedResampling(num_tasks=3, window=10, eps=0.5)
    for _ in range(10):
        dwr.record([0, 1, 2], [False, True, torch.rand(()) > 0.5])
    w = dwr.weights()
    assert int(w.argmax()) == 0
    assert w[1] >= 0.5 / float((dwr.failures() + 0.5).sum()) - 1e-12
    assert w[1] > 0


def test_window_forgets_old_outcomes():
    dwr = DynamicWeightedResampling(num_tasks=2, window=3, eps=1.0)
    dwr.record([0, 0, 0], [False, False, False])
    assert dwr.failures().tolist() == [3.0, 0.0]
    dwr.record([0, 0, 0], [True, True, True])  # pushes every failure out of the window
    assert dwr.failures().tolist() == [0.0, 0.0]
    torch.testing.assert_close(dwr.weights(), torch.tensor([0.5, 0.5], dtype=torch.float64))


def test_state_round_trip():
    a = DynamicWeightedResampling(num_tasks=2, window=5, eps=1.0)
    a.record([0, 1, 1], [False, True, False])
    b = DynamicWeightedResampling(num_tasks=2, window=5, eps=1.0)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.weights(), b.weights()) and b.outcomes[1].maxlen == 5


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"eps": 0.0}, "eps must be > 0, got 0.0"),
        ({"eps": -1.0}, "eps must be > 0"),
        ({"window": 0}, "window must be >= 1, got 0"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DynamicWeightedResampling(num_tasks=2, **kwargs)


def test_dwr_weights_shape_error():
    with pytest.raises(ValueError, match=r"failures must be \[K\], got shape \(2, 2\)"):
        dwr_weights(torch.zeros(2, 2), eps=1.0)


@pytest.mark.multiproc
def test_weights_reach_the_samplers_and_shift_the_task_mix():
    """Task 0 always fails, task 1 always succeeds: DWR must move sampling towards task 0."""

    class Record(RLModule):
        def on_train_start(self):
            self.tasks = []

        def training_step(self, batch, batch_idx):
            self.tasks.append([e.task_id for e in batch.stats.episodes if not e.cut])
            return super().training_step(batch, batch_idx)

    dwr = DynamicWeightedResampling(num_tasks=2, window=20, eps=0.1)
    dm = RolloutDataModule(
        env_id="tests.fake_envs:TwoTask-v0",
        num_envs=4,
        num_workers=1,
        reset_mode="autoreset",
        rollout_steps=12,
    )
    model = Record(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=1)
    L.Trainer(
        max_steps=12,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        callbacks=[dwr],
    ).fit(model, datamodule=dm)
    first = model.tasks[0]
    late = [t for step in model.tasks[-4:] for t in step]
    assert 0.2 < sum(t == 0 for t in first) / len(first) < 0.8  # uniform at the start
    assert sum(t == 0 for t in late) / len(late) > 0.8  # weights ~ (20.1, 0.1) later
    assert dwr.weights()[0] > 0.9
