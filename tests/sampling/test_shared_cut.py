"""DPSA's termination rate over every clip of a rank (``--data.truncation_scope rank``)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from fastlight.sampling.collector import Collector
from fastlight.sampling.shared_cut import SharedCut, cycle_key
from tests.fake_envs import FixedLengthEnv


def collector(lengths: list[int], cut, *, threshold: float = 0.5, mode: str = "dpsa") -> Collector:
    envs = [FixedLengthEnv(lengths=(n,), tag=i) for i, n in enumerate(lengths)]
    return Collector(envs, mode=mode, termination_threshold=threshold, max_horizon=20, shared_cut=cut)


def board(*num_envs: int) -> SharedCut:
    return SharedCut(mp.get_context("spawn"), list(num_envs))


def cycle_length(c: Collector, policy, key: int | None) -> int:
    return int(c.collect(policy, cut_key=key).validate().valid.shape[0])


def test_the_other_samplers_ended_clips_count(obs_value_policy):
    """4 + 4 clips, threshold 0.5: with 3 of the other sampler's clips ended, one end here cuts
    (this sampler alone would need two)."""
    cut = board(4, 4)
    other = cut.view(1)
    key = cycle_key(0, 0)
    other.begin(key)
    assert other.ended_fraction(key, 3) == 3 / 8
    here = collector([3, 9, 12, 15], cut.view(0))
    assert cycle_length(here, obs_value_policy, key) == 3  # cut at the first end: (3 + 1) / 8
    assert other.was_cut(key)  # so the other sampler cuts at its next step
    alone = collector([3, 9, 12, 15], None)
    assert cycle_length(alone, obs_value_policy, None) == 9  # its own rate: 2 of 4 at step 9


def test_a_cycle_cut_elsewhere_is_cut_at_the_first_step(obs_value_policy):
    cut = board(2, 2)
    cut.view(1).mark(cycle_key(3, 1))
    here = collector([10, 10], cut.view(0))
    assert cycle_length(here, obs_value_policy, cycle_key(3, 1)) == 1
    assert cycle_length(here, obs_value_policy, cycle_key(3, 2)) == 10  # the next key is not cut
    # A later key marked earlier than an older one keeps the later one (a lagging sampler's mark).
    cut.view(1).mark(cycle_key(4, 0))
    cut.view(0).mark(cycle_key(3, 2))
    assert cut.view(0).was_cut(cycle_key(4, 0))


def test_other_cycles_and_samplers_not_started_count_as_running(obs_value_policy):
    cut = board(2, 2)
    other = cut.view(1)
    other.begin(cycle_key(0, 0))
    other.ended_fraction(cycle_key(0, 0), 2)  # another cycle's ends do not count for this one
    here = collector([4, 6], cut.view(0))
    # 1 of 4 at step 4, then 2 of 4 at step 6: cut there (not before)
    assert cycle_length(here, obs_value_policy, cycle_key(1, 0)) == 6


def test_a_sampler_that_moved_on_still_counts_in_the_cycle_it_left(obs_value_policy):
    """A sampler whose clips all ended leaves the cycle before the rank cuts it; its ends still
    count for the others (its previous-cycle slot)."""
    cut = board(2, 2)
    early = collector([1, 2], cut.view(1), threshold=0.75)
    k = cycle_key(0, 0)
    # 2 of 4 ended < 0.75: it stops (nothing left to truncate) without cutting the cycle
    assert cycle_length(early, obs_value_policy, k) == 2
    assert not cut.view(0).was_cut(k)
    early.collect(obs_value_policy, cut_key=cycle_key(0, 1))  # it moves on to its next cycle
    late = collector([5, 30], cut.view(0), threshold=0.75)
    assert cycle_length(late, obs_value_policy, k) == 5  # (2 + 1) / 4 >= 0.75 at its first end


def test_sgr_cuts_the_rank_at_the_first_end_anywhere(obs_value_policy):
    cut = board(2, 2)
    other = cut.view(1)
    other.begin(cycle_key(0, 0))
    other.ended_fraction(cycle_key(0, 0), 1)
    here = collector([7, 9], cut.view(0), mode="sgr")
    assert cycle_length(here, obs_value_policy, cycle_key(0, 0)) == 1


def test_without_a_key_the_cycle_is_the_samplers_own(obs_value_policy):
    cut = board(2, 2)
    cut.view(1).mark(cycle_key(0, 0))
    here = collector([4, 6], cut.view(0))
    assert cycle_length(here, obs_value_policy, None) == 4  # extra cycles: its own rate, 1 of 2


@pytest.mark.parametrize(
    "kwargs",
    [{"mode": "autoreset"}, {"termination_threshold": "auto"}],
)
def test_collector_refuses_a_shared_cut_it_cannot_use(kwargs):
    envs = [FixedLengthEnv(lengths=(3,)) for _ in range(2)]
    with pytest.raises(
        ValueError, match=r"truncation_scope rank\) needs --data.reset_mode dpsa or sgr and a"
    ):
        Collector(envs, shared_cut=board(2, 2).view(0), **kwargs)


def test_cycle_key_bounds():
    assert cycle_key(2, 5) == 2 * 64 + 5
    with pytest.raises(ValueError, match=r"cycle index must be in \[0, 64\)"):
        cycle_key(0, 64)


@pytest.mark.multiproc
@pytest.mark.parametrize("scope", ["sampler", "rank"])
def test_two_sampler_processes_cut_their_cycles_together(scope):
    """Sampler 0's clips end after 2 steps, sampler 1's after 150: with ``rank`` scope sampler 1's
    cycles are cut as soon as sampler 0's ends make half of the rank's clips (its episodes are
    cut, far short of 150 steps); with ``sampler`` scope each sampler counts alone and sampler 1
    plays its 150 steps."""
    import lightning as L

    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.modules.rl_module import RLModule
    from tests.lightning_helpers import quiet_trainer, wait_no_children

    episodes = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            episodes.extend(batch.stats.episodes)

    dm = RolloutDataModule(
        env_id="tests.fake_envs:SamplerLength-v0",
        num_envs=4,
        num_workers=2,
        termination_threshold=0.5,
        max_horizon=200,
        cycles_per_step=2,
        truncation_scope=scope,
    )
    model = RLModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=1)
    quiet_trainer(max_steps=3, callbacks=[Record()]).fit(model, datamodule=dm)
    wait_no_children()
    long = [e for e in episodes if e.length > 2 or e.cut]  # sampler 1's (sampler 0's end at 2)
    assert len(long) >= 3 * 2 * 2  # 3 steps x 2 cycles x its 2 clips
    if scope == "sampler":
        assert all(e.length == 150 and not e.cut for e in long)
    else:
        # cut together with sampler 0 at step 2, a few steps later on a busy machine; 150 would
        # take 0.3 s longer than sampler 0's cycle
        assert all(e.cut and e.length < 150 for e in long), sorted(e.length for e in long)


def test_the_ray_fleet_refuses_a_rank_wide_cut():
    from torch import nn

    from fastlight.fleet.faults import FaultSettings
    from fastlight.fleet.ray.fleet import RayFleet
    from fastlight.sampling.worker import SamplerConfig

    configs = [SamplerConfig(env_id="CartPole-v1", num_envs=2, truncation_scope="rank") for _ in range(2)]
    with pytest.raises(ValueError, match="--data.truncation_scope rank shares the termination rate"):
        RayFleet().build(
            configs, nn.Linear(1, 1), rank=0, inference=None, trainer_device="cpu", example_obs=None,
            faults=FaultSettings(), start_method="spawn",
        )  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "fleet", "scope"),
    [
        ({}, None, "rank"),
        ({"max_staleness": 1}, None, "sampler"),
        ({"reset_mode": "autoreset"}, None, "sampler"),
        ({"termination_threshold": "auto"}, None, "sampler"),
        ({}, "ray", "sampler"),
    ],
)
def test_auto_scope_is_rank_only_where_it_can_work(overrides, fleet, scope):
    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.fleet.ray.fleet import RayFleet

    kw = {"fleet": RayFleet()} if fleet == "ray" else {}
    dm = RolloutDataModule(
        env_id="tests.fake_envs:FixedLength-v0", num_envs=4, num_workers=2, truncation_scope="auto",
        **overrides, **kw,
    )  # fmt: skip
    assert dm.truncation_scope == scope
    assert {c.truncation_scope for c in dm.sampler_configs(0)} == {scope}
    assert dm.hparams.truncation_scope == "auto"  # what the run was asked for stays recorded


def test_an_explicit_rank_scope_on_ray_is_refused_before_anything_starts():
    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.fleet.ray.fleet import RayFleet

    with pytest.raises(ValueError, match="truncation_scope rank shares the termination rate.*RayFleet"):
        RolloutDataModule(
            env_id="CartPole-v1", num_envs=2, num_workers=2, truncation_scope="rank", fleet=RayFleet()
        )
