"""Dynamic Weighted Resampling: the formula, the window, checkpoints, and the push to samplers."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from fastlight.callbacks.dwr import DynamicWeightedResampling, dwr_weights
from fastlight.data.datamodule import RolloutDataModule
from fastlight.modules.rl_module import RLModule

TOL = {"rtol": 0.0, "atol": 1e-12}  # float64 sums of a handful of terms


def test_weights_match_the_formula_on_a_hand_built_history():
    dwr = DynamicWeightedResampling(num_tasks=3, window=4, eps=1.0)
    # task 0: 3 failures of 3 -> f=1; task 1: 1 failure of 2 -> f=0.5; task 2: 0 of 2 -> f=0
    dwr.record([0, 0, 0, 1, 1, 2, 2], [False, False, False, True, False, True, True])
    torch.testing.assert_close(dwr.failure_rates(), torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64), **TOL)
    # (f + 1) = (2, 1.5, 1), sum 4.5
    expected = torch.tensor([2 / 4.5, 1.5 / 4.5, 1 / 4.5], dtype=torch.float64)
    torch.testing.assert_close(dwr.weights(), expected, **TOL)


def test_unequal_windows_use_the_rate_not_the_count():
    """Task 0: 1 outcome, a failure; task 1: 10 outcomes, 5 failures; task 2: no outcome yet.

    Rates f = (1, 0.5, 1) -> (f + 1) = (2, 1.5, 2), sum 5.5 -> (0.3636, 0.2727, 0.3636): the half-solved
    task 1 is sampled least. Counts would give f = (1, 5, 0) -> (2, 6, 1) / 9 = (0.222, 0.667, 0.111),
    sampling task 1 most only because it logged more episodes, so a count implementation fails here.
    """
    dwr = DynamicWeightedResampling(num_tasks=3, window=20, eps=1.0)
    dwr.record([0], [False])
    dwr.record([1] * 10, [False, True] * 5)
    torch.testing.assert_close(dwr.failure_rates(), torch.tensor([1.0, 0.5, 1.0], dtype=torch.float64), **TOL)
    w = dwr.weights()
    torch.testing.assert_close(w, torch.tensor([2 / 5.5, 1.5 / 5.5, 2 / 5.5], dtype=torch.float64), **TOL)
    by_count = torch.tensor([2 / 9, 6 / 9, 1 / 9], dtype=torch.float64)
    assert float((w - by_count).abs().max()) > 0.3
    assert int(w.argmin()) == 1 and int(by_count.argmax()) == 1


def test_untried_task_counts_as_always_failing():
    dwr = DynamicWeightedResampling(num_tasks=3, window=5, eps=0.5)
    torch.testing.assert_close(dwr.weights(), torch.full((3,), 1 / 3, dtype=torch.float64), **TOL)  # fresh
    dwr.record([0] * 5 + [2] * 5, [False] * 5 + [True] * 5)  # task 0 always fails, task 1 untried
    torch.testing.assert_close(dwr.failure_rates(), torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64), **TOL)
    w = dwr.weights()
    assert w[1] >= w[0]
    # (1.5, 1.5, 0.5) / 3.5
    torch.testing.assert_close(w, torch.tensor([1.5 / 3.5, 1.5 / 3.5, 0.5 / 3.5], dtype=torch.float64), **TOL)


def test_always_failing_task_gets_the_largest_weight_and_mastered_keeps_eps():
    dwr = DynamicWeightedResampling(num_tasks=3, window=10, eps=0.5)
    for i in range(10):
        dwr.record([0, 1, 2], [False, True, i % 2 == 0])
    # f = (1, 0, 0.5) -> (1.5, 0.5, 1.0) / 3.0
    w = dwr.weights()
    torch.testing.assert_close(w, torch.tensor([0.5, 0.5 / 3.0, 1 / 3.0], dtype=torch.float64), **TOL)
    assert int(w.argmax()) == 0
    assert w[1] > 0


def test_window_forgets_old_outcomes():
    dwr = DynamicWeightedResampling(num_tasks=2, window=3, eps=1.0)
    dwr.record([0, 0, 0, 1], [False, False, False, True])
    torch.testing.assert_close(dwr.failure_rates(), torch.tensor([1.0, 0.0], dtype=torch.float64), **TOL)
    dwr.record([0], [True])  # window of task 0 is now (F, F, T)
    torch.testing.assert_close(dwr.failure_rates(), torch.tensor([2 / 3, 0.0], dtype=torch.float64), **TOL)
    dwr.record([0, 0], [True, True])  # pushes every failure out of the window
    torch.testing.assert_close(dwr.failure_rates(), torch.tensor([0.0, 0.0], dtype=torch.float64), **TOL)
    torch.testing.assert_close(dwr.weights(), torch.tensor([0.5, 0.5], dtype=torch.float64), **TOL)


def test_state_round_trip():
    a = DynamicWeightedResampling(num_tasks=3, window=5, eps=1.0)
    a.record([0, 1, 1], [False, True, False])
    b = DynamicWeightedResampling(num_tasks=3, window=5, eps=1.0)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b.failure_rates(), torch.tensor([1.0, 0.5, 1.0], dtype=torch.float64), **TOL)
    torch.testing.assert_close(a.weights(), b.weights(), **TOL)
    assert b.outcomes[1].maxlen == 5


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
    with pytest.raises(ValueError, match=r"failure_rates must be \[K\], got shape \(2, 2\)"):
        dwr_weights(torch.zeros(2, 2), eps=1.0)


@pytest.mark.parametrize("bad", [[0.5, 2.0], [-0.1, 0.5], [float("nan"), 0.5], [3.0, 0.0]])
def test_dwr_weights_refuses_rates_outside_0_1(bad):
    """Counts (e.g. 3 failures) are not rates: refused rather than silently reweighted."""
    with pytest.raises(ValueError, match=r"failure rates must lie in \[0, 1\].*not counts"):
        dwr_weights(torch.tensor(bad), eps=1.0)


def test_dwr_weights_is_a_pure_float64_function_of_the_rates():
    rates = torch.tensor([0.25, 1.0], dtype=torch.float32)
    w = dwr_weights(rates, eps=0.25)
    assert w.dtype == torch.float64 and w.shape == (2,)
    torch.testing.assert_close(w, torch.tensor([0.5 / 1.75, 1.25 / 1.75], dtype=torch.float64), **TOL)
    assert rates.tolist() == [0.25, 1.0]  # input untouched


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
    # Once both tasks have outcomes, f = (1, 0): weights (1 + 0.1, 0 + 0.1) / 1.2 = (11/12, 1/12).
    torch.testing.assert_close(dwr.weights(), torch.tensor([11 / 12, 1 / 12], dtype=torch.float64), **TOL)
    # So ~0.917 of the late episodes are task 0 (uniform would be ~0.5). The last 4 updates end
    # ~65 episodes (65 in the seeded run, 0.95 of them task 0): binomial sd ~ sqrt(0.917 * 0.083 / 65)
    # ~ 0.034, so 0.8 is a > 3 sd margin below the expected 0.917 and far above no shift.
    assert len(late) >= 40, len(late)
    assert sum(t == 0 for t in late) / len(late) > 0.8


class _TaskData(L.LightningDataModule):
    """What DWR reads of a DataModule (``MultiTaskData``): the env's task names (None: a single-task
    env), and its env id for messages."""

    def __init__(self, task_names, env_id="some-env-v0"):
        super().__init__()
        self.save_hyperparameters({"env_id": env_id})
        self.task_names = task_names
        self.pushed: list[list[float]] = []

    def set_task_weights(self, weights):
        self.pushed.append(list(weights))


def _setup(dwr: DynamicWeightedResampling, data: _TaskData) -> None:
    from types import SimpleNamespace

    dwr.setup(SimpleNamespace(datamodule=data), None, "fit")  # type: ignore[arg-type]


def test_task_count_and_names_come_from_the_env_at_setup():
    dwr = DynamicWeightedResampling(window=5)
    assert dwr.num_tasks is None
    _setup(dwr, _TaskData(("reach-v3", "push-v3", "door-open-v3")))
    assert dwr.num_tasks == 3 and dwr.task_names == ["reach-v3", "push-v3", "door-open-v3"]
    torch.testing.assert_close(dwr.weights(), torch.full((3,), 1 / 3, dtype=torch.float64), **TOL)
    dwr.record([2], [True])  # ids up to 2 are accepted now
    assert dwr.failure_rates().tolist() == [1.0, 1.0, 0.0]


def test_given_names_size_the_callback_and_are_kept():
    dwr = DynamicWeightedResampling(task_names=["a", "b"])
    assert dwr.num_tasks == 2
    _setup(dwr, _TaskData(("a-v3", "b-v3")))
    assert dwr.task_names == ["a", "b"]


def test_a_count_that_disagrees_with_the_env_stops_the_run_naming_both():
    match = r"num_tasks is 10 but --data.env_id reach-v0 has 1 tasks \['reach-v3'\]"
    with pytest.raises(ValueError, match=match):
        _setup(DynamicWeightedResampling(num_tasks=10), _TaskData(("reach-v3",), env_id="reach-v0"))


def test_a_single_task_env_without_num_tasks_is_refused_naming_the_env():
    match = r"needs a multi-task env .*; --data.env_id highway-fast-v0 has no tasks"
    with pytest.raises(TypeError, match=match):
        _setup(DynamicWeightedResampling(), _TaskData(None, env_id="highway-fast-v0"))
    explicit = DynamicWeightedResampling(num_tasks=2)  # an explicit count still works (e.g. a user's own env)
    _setup(explicit, _TaskData(None))
    assert explicit.num_tasks == 2


def test_datamodule_reads_task_names_from_a_multi_task_env_only():
    two = RolloutDataModule(env_id="tests.fake_envs:TwoTask-v0", num_envs=1, num_workers=1)
    assert two.task_names == ("fails", "succeeds")
    one = RolloutDataModule(env_id="tests.fake_envs:FixedLength-v0", num_envs=1, num_workers=1)
    assert one.task_names is None


class _Ranks:
    """Stands in for a trainer of len(rows) DDP ranks, seen from rank 0: ``all_gather`` stacks what
    every rank contributes to the same call (each rank pads its own rows as ``_gather_rows`` does)."""

    def __init__(self, rows: list[torch.Tensor]) -> None:
        self.rows, self.world_size, self.calls = rows, len(rows), 0
        self.strategy = self
        self.root_device = torch.device("cpu")

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if t.dim() == 1:  # the row counts
            return torch.stack([torch.tensor([r.shape[0]]) for r in self.rows])
        pad = [torch.zeros(t.shape[0] - r.shape[0], 2, dtype=torch.long) for r in self.rows]
        return torch.stack([torch.cat([r, p]) for r, p in zip(self.rows, pad, strict=True)])


@pytest.mark.parametrize("counts", [(0, 0), (0, 3), (2, 0)])
def test_gather_rows_when_some_or_all_ranks_finished_no_episode(counts):
    from fastlight.callbacks.dwr import _gather_rows

    rows = [torch.arange(2 * n).reshape(n, 2) + 10 * r for r, n in enumerate(counts)]
    ranks = _Ranks(rows)
    got = _gather_rows(ranks, rows[0])
    assert torch.equal(got, torch.cat(rows))  # every rank's rows in rank order, none when none ended
    assert got.shape == (sum(counts), 2)
    # with no rows anywhere, the second gather is skipped on every rank alike (they share the counts)
    assert ranks.calls == (1 if sum(counts) == 0 else 2)
