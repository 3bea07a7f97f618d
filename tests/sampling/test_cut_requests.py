"""Rounds cut for the batch they would miss (``--data.cut_in_flight``, asynchronous runs)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from fastlight.data.prefetch import Prefetcher
from fastlight.rollout import Rollout
from fastlight.sampling.collector import Collector
from fastlight.sampling.cut_requests import CUT_MIN_SHARE, CutRequests, rounds_to_cut
from tests.fake_envs import FixedLengthEnv
from tests.policies import ObsValuePolicy


def requests() -> CutRequests:
    return CutRequests(mp.get_context("spawn"), 2)


def collector(mode: str, lengths: list[int], board: CutRequests | None, at_step: int | None) -> Collector:
    """Envs with episodes of ``lengths``; the trainer asks sampler 0 for its round once env 0 has
    taken ``at_step`` steps of its episode (from the heartbeat, which runs after every env step)."""
    envs = [FixedLengthEnv(lengths=(n,), tag=i) for i, n in enumerate(lengths)]
    asked = []

    def beat() -> None:
        if board is not None and at_step is not None and envs[0].t == at_step and not asked:
            asked.append(True)
            board.request([0])

    return Collector(
        envs, mode=mode, termination_threshold=1.0, max_horizon=50, rollout_steps=12, heartbeat=beat,
        cut_requests=board.view(0) if board is not None else None,
    )  # fmt: skip


def test_a_requested_dpsa_cycle_ends_after_the_step_under_way(obs_value_policy):
    """Threshold 1.0: the cycle would run to the longest clip (30 steps). Asked at env 0's 4th step,
    it ends there: every clip still running truncated, bootstrapped and recorded as cut, and the
    steps before the cut are those of the uncut cycle."""
    board = requests()
    c = collector("dpsa", [20, 25, 30], board, at_step=4)
    cut = c.collect(obs_value_policy, cut_since=board.view(0).count()).validate()
    full = collector("dpsa", [20, 25, 30], None, None).collect(obs_value_policy).validate()
    assert full.valid.shape[0] == 30 and full.stats.cut_in_flight == 0
    assert cut.valid.shape[0] == 4 and cut.stats.cut_in_flight == 1
    assert cut.truncated[-1].all() and not cut.terminated.any()
    assert (cut.bootstrap_values[-1] != 0).all()  # V(s_{t+1}) of each truncated clip
    assert [(e.length, e.cut) for e in cut.stats.episodes] == [(4, True)] * 3
    for name in ("obs", "actions", "rewards", "values"):
        torch.testing.assert_close(getattr(cut, name), getattr(full, name)[:4], rtol=0, atol=0)


def test_a_request_before_the_round_or_without_cut_since_does_not_cut(obs_value_policy):
    board = requests()
    board.request([0])  # for the round already sent
    c = collector("dpsa", [6, 8], board, at_step=None)
    assert c.collect(obs_value_policy, cut_since=board.view(0).count()).valid.shape[0] == 8
    c = collector("dpsa", [6, 8], board, at_step=3)
    assert c.collect(obs_value_policy).valid.shape[0] == 8  # cut_since None: never cut
    assert board.view(1).count() == 0  # another sampler's counter is its own


def test_an_autoreset_segment_ends_early_and_its_episodes_go_on(obs_value_policy):
    board = requests()
    c = collector("autoreset", [100, 100], board, at_step=5)
    since = board.view(0).count()
    first = c.collect(obs_value_policy, cut_since=since).validate()
    assert first.valid.shape[0] == 5 and first.stats.cut_in_flight == 1
    assert first.truncated[-1].all() and not first.stats.episodes  # nothing ended: a segment boundary
    second = c.collect(obs_value_policy, cut_since=board.view(0).count()).validate()
    assert second.valid.shape[0] == 12  # no new request: a whole segment
    assert second.obs[0, :, 1].tolist() == [5.0, 5.0]  # the episodes continue at their 6th step


def test_cut_since_needs_cut_requests(obs_value_policy):
    c = collector("dpsa", [3], None, None)
    with pytest.raises(ValueError, match="needs a Collector built with cut_requests"):
        c.collect(obs_value_policy, cut_since=0)


def _item(version: int, width: int = 1) -> Rollout:
    c = Collector([FixedLengthEnv(lengths=(3,), tag=i) for i in range(width)], mode="dpsa",
                  termination_threshold=1.0, max_horizon=10)  # fmt: skip
    return c.collect(ObsValuePolicy(), policy_version=version)


def test_the_prefetcher_adds_the_cut_rounds_to_the_batch_and_drops_stale_ones():
    """2 items per batch; the callback answers with one fresh round and one two versions old
    (max_staleness 1): the batch holds 3 rounds' columns and counts the stale one as dropped."""
    feed = [_item(5), _item(5)]
    calls = []

    def next_item(timeout: float) -> Rollout | None:
        return feed.pop(0) if feed else None

    def cut_in_flight(timeout: float) -> list[Rollout]:
        calls.append(timeout)
        return [_item(5, width=2), _item(3)]

    p = Prefetcher(next_item, lambda: 5, items_per_batch=2, max_staleness=1, cut_in_flight=cut_in_flight)
    p.start()
    try:
        batch = p.get(timeout=10.0)
    finally:
        p.stop()
    assert len(calls) == 1 and calls[0] > 0
    assert batch.valid.shape[1] == 1 + 1 + 2
    assert batch.stats.dropped_stale == 1


def test_the_last_sender_and_rounds_just_begun_are_not_asked():
    """Sampler 0 sent the item that completed the batch; sampler 1's round began 0.5 s ago of its
    usual 10 s (left to finish), sampler 2's 5 s ago (asked), sampler 3 has sent nothing yet."""
    now = 100.0
    arrived = {0: now, 1: now - 0.5, 2: now - 5.0}
    round_s = {0: 10.0, 1: 10.0, 2: 10.0}
    assert CUT_MIN_SHARE * 10.0 > 0.5
    asked = rounds_to_cut([0, 1, 2, 3], last_sender=0, arrived=arrived, round_s=round_s, now=now)
    assert asked == [2, 3]
    # without a round length yet, any round is asked for
    assert rounds_to_cut([0, 1], last_sender=None, arrived={0: now}, round_s={}, now=now) == [0, 1]


def test_cut_requests_need_a_sampler():
    with pytest.raises(ValueError, match="at least one sampler"):
        CutRequests(mp.get_context("spawn"), 0)


@pytest.mark.multiproc
def test_an_asynchronous_batch_takes_the_other_samplers_round_cut_short():
    """``max_staleness 1``: sampler 0's clips end after 2 steps, sampler 1's after 150. Sampler 0's
    items complete each batch; sampler 1's rounds are then cut at their next step and join it
    (without the cut they play 150 steps: the same setting in test_shared_cut's sampler scope)."""
    import lightning as L

    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.modules.rl_module import RLModule
    from tests.lightning_helpers import quiet_trainer, wait_no_children

    episodes, cut_counts, lags, threads = [], [], [], []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            threads.append(torch.get_num_threads())
            episodes.extend(batch.stats.episodes)
            cut_counts.append(batch.stats.cut_in_flight)
            lags.append(int(pl_module.policy_version) - int(batch.policy_version[batch.valid].min()))

    dm = RolloutDataModule(
        env_id="tests.fake_envs:SamplerLength-v0", num_envs=4, num_workers=2, termination_threshold=0.5,
        max_horizon=200, cycles_per_step=2, max_staleness=1,
    )  # fmt: skip
    assert dm.cut_in_flight  # on by default in an asynchronous run of the local fleet
    model = RLModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=1)
    before = torch.get_num_threads()
    planned, _ = dm.thread_plan(1)
    quiet_trainer(max_steps=4, callbacks=[Record()]).fit(model, datamodule=dm)
    wait_no_children()
    # the trainer computed on the cores its 2 samplers leave, and has its threads back after
    assert set(threads) == {planned if planned is not None else before}
    assert torch.get_num_threads() == before
    long = [e for e in episodes if e.length > 2 or e.cut]  # sampler 1's (sampler 0's end at 2)
    assert long, "sampler 1's cut rounds never reached a batch"
    assert all(e.cut and e.length < 150 for e in long), sorted(e.length for e in long)
    assert sum(cut_counts) >= 1 and max(lags) <= 1


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [({}, False), ({"max_staleness": 1}, True), ({"max_staleness": 1, "cut_in_flight": False}, False)],
)
def test_cut_in_flight_is_on_for_asynchronous_local_runs(overrides, expected):
    from fastlight.data.datamodule import RolloutDataModule

    dm = RolloutDataModule(env_id="tests.fake_envs:FixedLength-v0", num_envs=4, num_workers=2, **overrides)
    assert dm.cut_in_flight is expected
    assert {c.cut_in_flight for c in dm.sampler_configs(0)} == {expected}


def test_cut_in_flight_refusals():
    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.fleet.ray.fleet import RayFleet

    kw = {"env_id": "tests.fake_envs:FixedLength-v0", "num_envs": 2, "num_workers": 2}
    with pytest.raises(ValueError, match=r"--data.cut_in_flight true needs --data.max_staleness >= 1"):
        RolloutDataModule(**kw, cut_in_flight=True)
    with pytest.raises(ValueError, match=r"--data.cut_in_flight true asks .*RayFleet"):
        RolloutDataModule(**kw, cut_in_flight=True, max_staleness=1, fleet=RayFleet())
    ray = RolloutDataModule(**kw, max_staleness=1, fleet=RayFleet())
    assert not ray.cut_in_flight  # the default: off where the samplers cannot be asked
