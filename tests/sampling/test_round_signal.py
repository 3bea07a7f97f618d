"""A rank's samplers end their rounds together (``--data.rank_rounds``): on DPSA's termination rate
over every clip of the rank (strictly on-policy), or when the trainer cuts the rounds in flight for
the batch they would miss (asynchronous runs)."""

from __future__ import annotations

import multiprocessing as mp
import threading

import pytest
import torch

from fastlight.data.prefetch import Prefetcher
from fastlight.fleet.base import FleetBuild
from fastlight.rollout import Rollout
from fastlight.sampling.bundle import RankHandles, SamplerBundle, SamplerConfig
from fastlight.sampling.collector import Collector
from fastlight.sampling.round_signal import CUT_MIN_SHARE, RoundSignal, cycle_key, rounds_to_cut
from tests.fake_envs import FixedLengthEnv
from tests.policies import ObsValuePolicy

CTX = mp.get_context("spawn")


# ---------------------------------------------------------------------- on-policy: the rank's rate
def collector(lengths: list[int], view, *, threshold: float = 0.5, mode: str = "dpsa") -> Collector:
    envs = [FixedLengthEnv(lengths=(n,), tag=i) for i, n in enumerate(lengths)]
    return Collector(envs, mode=mode, termination_threshold=threshold, max_horizon=20, rounds=view)


def board(*num_envs: int) -> RoundSignal:
    return RoundSignal(CTX, list(num_envs), shared_rate=True)


def cycle_length(c: Collector, policy, version: int = 0, k: int | None = 0) -> int:
    return int(c.collect(policy, policy_version=version, cycle=k).validate().valid.shape[0])


def test_the_other_samplers_ended_clips_count(obs_value_policy):
    """4 + 4 clips, threshold 0.5: with 3 of the other sampler's clips ended, one end here cuts
    (this sampler alone would need two)."""
    signal = board(4, 4)
    other = signal.view(1)
    key = cycle_key(0, 0)
    other.begin(key)
    assert other.ended_fraction(key, 3) == 3 / 8
    here = collector([3, 9, 12, 15], signal.view(0))
    assert cycle_length(here, obs_value_policy, 0, 0) == 3  # cut at the first end: (3 + 1) / 8
    assert other.was_cut(key)  # so the other sampler cuts at its next step
    alone = collector([3, 9, 12, 15], None)
    assert cycle_length(alone, obs_value_policy, 0, 0) == 9  # its own rate: 2 of 4 at step 9


def test_a_cycle_cut_elsewhere_is_cut_at_the_first_step(obs_value_policy):
    signal = board(2, 2)
    signal.view(1).mark(cycle_key(3, 1))
    here = collector([10, 10], signal.view(0))
    assert cycle_length(here, obs_value_policy, 3, 1) == 1
    assert cycle_length(here, obs_value_policy, 3, 2) == 10  # the next key is not cut
    # A later key marked earlier than an older one keeps the later one (a lagging sampler's mark).
    signal.view(1).mark(cycle_key(4, 0))
    signal.view(0).mark(cycle_key(3, 2))
    assert signal.view(0).was_cut(cycle_key(4, 0))


def test_other_cycles_and_samplers_not_started_count_as_running(obs_value_policy):
    signal = board(2, 2)
    other = signal.view(1)
    other.begin(cycle_key(0, 0))
    other.ended_fraction(cycle_key(0, 0), 2)  # another cycle's ends do not count for this one
    here = collector([4, 6], signal.view(0))
    # 1 of 4 at step 4, then 2 of 4 at step 6: cut there (not before)
    assert cycle_length(here, obs_value_policy, 1, 0) == 6


def test_a_sampler_that_moved_on_still_counts_in_the_cycle_it_left(obs_value_policy):
    """A sampler whose clips all ended leaves the cycle before the rank cuts it; its ends still
    count for the others (its previous-cycle slot)."""
    signal = board(2, 2)
    early = collector([1, 2], signal.view(1), threshold=0.75)
    k = cycle_key(0, 0)
    # 2 of 4 ended < 0.75: it stops (nothing left to truncate) without cutting the cycle
    assert cycle_length(early, obs_value_policy, 0, 0) == 2
    assert not signal.view(0).was_cut(k)
    early.collect(obs_value_policy, policy_version=0, cycle=1)  # it moves on to its next cycle
    late = collector([5, 30], signal.view(0), threshold=0.75)
    assert cycle_length(late, obs_value_policy, 0, 0) == 5  # (2 + 1) / 4 >= 0.75 at its first end


@pytest.mark.parametrize("length", [20, 30])
def test_a_sampler_at_its_horizon_does_not_cut_the_others(obs_value_policy, length):
    """max_horizon counts a sampler's own env steps: one that reaches it first (its episodes ended
    by the env's time limit at the horizon, 20, or still running, 30) ends its cycle alone; a slower
    sampler on the same cycle is not cut short of its own horizon (threshold 1.0: nothing else cuts)."""
    signal = board(2, 2)
    k = cycle_key(0, 0)

    def sampler(index: int) -> Collector:
        envs = [FixedLengthEnv(lengths=(length,), tag=i, truncate=True) for i in range(2)]
        return Collector(envs, termination_threshold=1.0, max_horizon=20, rounds=signal.view(index))

    fast = sampler(0).collect(obs_value_policy, policy_version=0, cycle=0)
    assert [(e.length, e.cut) for e in fast.stats.episodes] == [(20, length > 20)] * 2
    assert not signal.view(1).was_cut(k)
    slow = sampler(1).collect(obs_value_policy, policy_version=0, cycle=0)  # its cycle on the same key
    assert [(e.length, e.cut) for e in slow.stats.episodes] == [(20, length > 20)] * 2


def test_sgr_cuts_the_rank_at_the_first_end_anywhere(obs_value_policy):
    signal = board(2, 2)
    other = signal.view(1)
    other.begin(cycle_key(0, 0))
    other.ended_fraction(cycle_key(0, 0), 1)
    here = collector([7, 9], signal.view(0), mode="sgr")
    assert cycle_length(here, obs_value_policy, 0, 0) == 1


def test_without_a_cycle_index_the_cycle_is_the_samplers_own(obs_value_policy):
    signal = board(2, 2)
    signal.view(1).mark(cycle_key(0, 0))
    here = collector([4, 6], signal.view(0))
    assert cycle_length(here, obs_value_policy, 0, None) == 4  # extra cycles: its own rate, 1 of 2


@pytest.mark.parametrize(
    ("kwargs", "needs"),
    [
        ({"mode": "autoreset"}, "--data.reset_mode dpsa or sgr, got 'autoreset'"),
        ({"termination_threshold": "auto"}, "--data.termination_threshold a number, not auto, got 'auto'"),
    ],
)
def test_collector_refuses_a_shared_rate_it_cannot_use(kwargs, needs):
    envs = [FixedLengthEnv(lengths=(3,)) for _ in range(2)]
    with pytest.raises(ValueError, match=r"termination rate \(--data.rank_rounds together\) needs " + needs):
        Collector(envs, rounds=board(2, 2).view(0), **kwargs)
    Collector(envs, rounds=RoundSignal(CTX, [2, 2], shared_rate=False).view(0), **kwargs)  # a cut: any mode


def test_cycle_key_bounds():
    assert cycle_key(2, 5) == 2 * 64 + 5
    with pytest.raises(ValueError, match=r"cycle index must be in \[0, 64\)"):
        cycle_key(0, 64)


def test_a_signal_needs_samplers_with_clips():
    for num_envs in ([], [2, 0]):
        with pytest.raises(ValueError, match=r"RoundSignal needs 1..65535 clips per sampler"):
            RoundSignal(CTX, num_envs, shared_rate=True)


# ---------------------------------------------------------------------- asynchronous: cut in flight
def requests() -> RoundSignal:
    return RoundSignal(CTX, [3, 3], shared_rate=False)


def asked_collector(
    mode: str, lengths: list[int], signal: RoundSignal | None, at_step: int | None
) -> Collector:
    """Envs with episodes of ``lengths``; the trainer asks sampler 0 for its round once env 0 has
    taken ``at_step`` steps of its episode (from the heartbeat, which runs after every env step)."""
    envs = [FixedLengthEnv(lengths=(n,), tag=i) for i, n in enumerate(lengths)]
    asked = []

    def beat() -> None:
        if signal is not None and at_step is not None and envs[0].t == at_step and not asked:
            asked.append(True)
            signal.request([0])

    return Collector(
        envs, mode=mode, termination_threshold=1.0, max_horizon=50, rollout_steps=12, heartbeat=beat,
        rounds=signal.view(0) if signal is not None else None,
    )  # fmt: skip


def test_a_requested_dpsa_cycle_ends_after_the_step_under_way(obs_value_policy):
    """Threshold 1.0: the cycle would run to the longest clip (30 steps). Asked at env 0's 4th step,
    it ends there: every clip still running truncated, bootstrapped and recorded as cut, and the
    steps before the cut are those of the uncut cycle."""
    signal = requests()
    c = asked_collector("dpsa", [20, 25, 30], signal, at_step=4)
    cut = c.collect(obs_value_policy, cycle=0).validate()
    full = asked_collector("dpsa", [20, 25, 30], None, None).collect(obs_value_policy).validate()
    assert full.valid.shape[0] == 30 and full.stats.cut_in_flight == 0
    assert cut.valid.shape[0] == 4 and cut.stats.cut_in_flight == 1
    assert cut.truncated[-1].all() and not cut.terminated.any()
    assert (cut.bootstrap_values[-1] != 0).all()  # V(s_{t+1}) of each truncated clip
    assert [(e.length, e.cut) for e in cut.stats.episodes] == [(4, True)] * 3
    for name in ("obs", "actions", "rewards", "values"):
        torch.testing.assert_close(getattr(cut, name), getattr(full, name)[:4], rtol=0, atol=0)


def test_a_request_before_the_round_or_outside_one_does_not_cut(obs_value_policy):
    signal = requests()
    signal.request([0])  # for the round already sent
    c = asked_collector("dpsa", [6, 8], signal, at_step=None)
    assert c.collect(obs_value_policy, cycle=0).valid.shape[0] == 8
    c = asked_collector("dpsa", [6, 8], signal, at_step=3)
    assert c.collect(obs_value_policy).valid.shape[0] == 8  # no round begun: never cut
    assert signal.requests[1] == 0  # another sampler's counter is its own


def test_the_valid_step_budgets_extra_cycles_are_cut_within_the_round(obs_value_policy):
    """A request after the step's cycle 0 ended cuts the round's next (extra) cycle at its first
    step; the next step's cycle 0 begins a new round, which that request no longer cuts."""
    signal = requests()
    c = asked_collector("dpsa", [20, 25, 30], signal, at_step=None)
    assert c.collect(obs_value_policy, cycle=0).valid.shape[0] == 30
    signal.request([0])
    extra = c.collect(obs_value_policy)
    assert extra.valid.shape[0] == 1 and extra.stats.cut_in_flight == 1
    assert c.collect(obs_value_policy, cycle=0).valid.shape[0] == 30


def test_an_autoreset_segment_ends_early_and_its_episodes_go_on(obs_value_policy):
    signal = requests()
    c = asked_collector("autoreset", [100, 100], signal, at_step=5)
    first = c.collect(obs_value_policy, cycle=0).validate()
    assert first.valid.shape[0] == 5 and first.stats.cut_in_flight == 1
    assert first.truncated[-1].all() and not first.stats.episodes  # nothing ended: a segment boundary
    second = c.collect(obs_value_policy, cycle=0).validate()
    assert second.valid.shape[0] == 12  # no new request: a whole segment
    assert second.obs[0, :, 1].tolist() == [5.0, 5.0]  # the episodes continue at their 6th step


def test_without_a_signal_a_cycle_index_changes_nothing(obs_value_policy):
    c = asked_collector("dpsa", [3, 5], None, None)
    r = c.collect(obs_value_policy, cycle=0)
    assert r.valid.shape[0] == 5 and r.stats.cut_in_flight == 0


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


# ---------------------------------------------------------------------- the bundle's handle
@pytest.mark.parametrize(("staleness", "shared_rate"), [(0, True), (2, False)])
def test_the_rank_gets_one_signal_whose_trigger_follows_max_staleness(staleness, shared_rate):
    configs = [
        SamplerConfig(env_id="x", num_envs=n, max_staleness=staleness, rank_rounds="together") for n in (2, 3)
    ]
    handles = RankHandles(CTX, configs)
    assert handles.rounds is not None and handles.rounds.shared_rate is shared_rate
    assert handles.rounds.total == 5
    stop = threading.Event()
    bundle = handles.bundle(1, configs[1], policy=None, weights=None, beat=lambda: None, stop=stop)
    assert bundle.rounds is not None and bundle.rounds.index == 1
    assert bundle.task_weights is handles.task_weights
    apart = [SamplerConfig(env_id="x", num_envs=2) for _ in range(2)]
    assert RankHandles(CTX, apart).rounds is None
    with pytest.raises(ValueError, match="rank_rounds must be the same for every sampler of a rank"):
        RankHandles(CTX, [configs[0], apart[0]])


def test_a_bundle_refuses_a_signal_its_config_does_not_ask_for():
    kw = {"index": 0, "policy": None, "weights": None, "beat": lambda: None, "stop": threading.Event()}
    together = SamplerConfig(env_id="x", num_envs=2, rank_rounds="together")
    with pytest.raises(ValueError, match="sampler 0: rank_rounds 'together' needs a round signal"):
        SamplerBundle(config=together, **kw)
    with pytest.raises(ValueError, match="sampler 0: rank_rounds 'apart' takes no round signal"):
        SamplerBundle(config=SamplerConfig(env_id="x", num_envs=2), rounds=board(2).view(0), **kw)


# ---------------------------------------------------------------------- the setting, end to end
@pytest.mark.multiproc
@pytest.mark.parametrize("rounds", ["apart", "together"])
def test_two_sampler_processes_cut_their_cycles_together(rounds):
    """Sampler 0's clips end after 2 steps, sampler 1's after 150: ``together``, sampler 1's cycles
    are cut as soon as sampler 0's ends make half of the rank's clips (its episodes are cut, far
    short of 150 steps); ``apart``, each sampler counts alone and sampler 1 plays its 150 steps."""
    import lightning as L

    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.modules.rl_module import RLModule
    from tests.lightning_helpers import quiet_trainer, wait_no_children

    episodes = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            episodes.extend(batch.stats.episodes)

    dm = RolloutDataModule(
        env_id="tests.fake_envs:SamplerLength-v0", num_envs=4, num_workers=2, termination_threshold=0.5,
        max_horizon=200, cycles_per_step=2, rank_rounds=rounds,
    )  # fmt: skip
    model = RLModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=1)
    quiet_trainer(max_steps=3, callbacks=[Record()]).fit(model, datamodule=dm)
    wait_no_children()
    long = [e for e in episodes if e.length > 2 or e.cut]  # sampler 1's (sampler 0's end at 2)
    assert len(long) >= 3 * 2 * 2  # 3 steps x 2 cycles x its 2 clips
    if rounds == "apart":
        assert all(e.length == 150 and not e.cut for e in long)
    else:
        # cut together with sampler 0 at step 2, a few steps later on a busy machine; 150 would
        # take 0.3 s longer than sampler 0's cycle
        assert all(e.cut and e.length < 150 for e in long), sorted(e.length for e in long)


@pytest.mark.multiproc
def test_an_asynchronous_batch_takes_the_other_samplers_round_cut_short():
    """``max_staleness 1``: sampler 0's clips end after 2 steps, sampler 1's after ``LONG``. Sampler 0's
    items complete each batch; sampler 1's rounds are then cut at their next step and join it
    (without the cut they play ``LONG`` steps)."""
    LONG = 1000  # noqa: N806 - a constant of this test
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

    # Sampler 1's clips last 1,000 steps (2 s): an uncut round outlasts any update on a slow or loaded
    # machine (with 150 steps, 0.3 s, a round could end before the trainer asked for it).
    dm = RolloutDataModule(
        env_id="tests.fake_envs:SamplerLength-v0", env_kwargs={"long": LONG}, num_envs=4, num_workers=2,
        termination_threshold=0.5, max_horizon=LONG + 50, cycles_per_step=2, max_staleness=1,
    )  # fmt: skip
    assert dm.rank_rounds == "together"  # the default in an asynchronous run of the local fleet
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
    assert all(e.cut and e.length < LONG for e in long), sorted(e.length for e in long)
    assert sum(cut_counts) >= 1 and max(lags) <= 1


@pytest.mark.parametrize(
    ("overrides", "fleet", "resolved"),
    [
        ({}, None, "together"),
        ({"max_staleness": 1}, None, "together"),
        ({"max_staleness": 1, "reset_mode": "autoreset"}, None, "together"),
        ({"max_staleness": 1, "rank_rounds": "apart"}, None, "apart"),
        ({"reset_mode": "autoreset"}, None, "apart"),
        ({"termination_threshold": "auto"}, None, "apart"),
        ({}, "ray", "apart"),
        ({"max_staleness": 1}, "ray", "apart"),
    ],
)
def test_auto_is_together_only_where_it_can_work(overrides, fleet, resolved):
    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.fleet.ray.fleet import RayFleet

    kw = {"fleet": RayFleet()} if fleet == "ray" else {}
    dm = RolloutDataModule(
        env_id="tests.fake_envs:FixedLength-v0", num_envs=4, num_workers=2, **overrides, **kw
    )
    assert dm.rank_rounds == resolved
    assert {c.rank_rounds for c in dm.sampler_configs(0)} == {resolved}
    assert dm.hparams.rank_rounds == overrides.get("rank_rounds", "auto")  # what was asked stays recorded


@pytest.mark.parametrize("staleness", [0, 1])
def test_together_on_ray_is_refused_before_anything_starts(staleness):
    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.fleet.ray.fleet import RayFleet

    with pytest.raises(ValueError, match="--data.rank_rounds together signals through .*RayFleet"):
        RolloutDataModule(
            env_id="CartPole-v1", num_envs=2, num_workers=2, rank_rounds="together", max_staleness=staleness,
            fleet=RayFleet(),
        )  # fmt: skip


def test_the_ray_fleet_refuses_a_round_signal():
    from torch import nn

    from fastlight.fleet.faults import FaultSettings
    from fastlight.fleet.ray.fleet import RayFleet

    configs = [SamplerConfig(env_id="CartPole-v1", num_envs=2, rank_rounds="together") for _ in range(2)]
    with pytest.raises(ValueError, match="--data.rank_rounds together signals through the trainer machine's"):
        RayFleet().build(FleetBuild(configs, nn.Linear(1, 1), faults=FaultSettings()))
