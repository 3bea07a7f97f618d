"""``benchmarks.sampling.model``: the invariants a model of the sampling cycle must keep (FAST §Problem
Definition, §DPSA), its agreement with the auto threshold's cost model, and one measured cell."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from benchmarks.sampling.model import Costs, erlang_lengths, fixed_lengths, observed_lengths, predict
from benchmarks.sampling.model_cells import current_cells, predicted
from fastlight.sampling.auto_threshold import CycleCosts, ThresholdChooser

#: Every env step costs 10 ms of CPU; nothing else costs anything.
FREE = Costs(step_s=0.01, row_s=0.0, row_env_s=0.0, round_s=0.0)
VARIED = erlang_lengths(mean=10.9, cap=30, limit_share=0.04)  # highway-fast-v0 under a random policy
LOADED = Costs(step_s=0.037, load_s=0.3, reset_cpu_s=0.012)  # sampling.md: 0.3 s scenario load


def test_equal_lengths_and_free_resets_make_every_mode_the_same():
    rates = {}
    for mode, thr in (("sgr", 0.5), ("dpsa", 0.5), ("dpsa", 1.0), ("autoreset", 0.5)):
        p = predict(mode=mode, clips=8, threshold=thr, cores=2, costs=FREE, lengths=fixed_lengths(length=12))
        assert p.sample_efficiency == pytest.approx(1.0)
        assert p.time_efficiency == pytest.approx(1.0)
        rates[f"{mode}@{thr}"] = p.effective_tps
    # 2 cores, 10 ms a step: 200 valid steps/s, whatever the mode.
    assert rates == pytest.approx(dict.fromkeys(rates, 200.0), rel=1e-9)
    seq = predict(mode="sequential", clips=8, cores=2, costs=FREE, lengths=fixed_lengths(length=12))
    assert seq.effective_tps == pytest.approx(100.0) and seq.workers == 1


@pytest.mark.parametrize("clips,cores", [(10, 2), (100, 8)])
def test_sgr_is_below_dpsa_when_lengths_vary_and_resets_are_costly(clips, cores):
    kw = dict(clips=clips, cores=cores, costs=LOADED, lengths=VARIED)
    sgr = predict(mode="sgr", **kw)
    for thr in (0.5, 1.0):
        dpsa = predict(mode="dpsa", threshold=thr, **kw)
        assert sgr.effective_tps < dpsa.effective_tps
        assert sgr.time_efficiency < dpsa.time_efficiency  # FAST: SGR's time efficiency collapses
        assert sgr.mean_episode_length < dpsa.mean_episode_length  # and its episodes are cut short
    assert sgr.sample_efficiency == pytest.approx(1.0)


def test_autoreset_wastes_no_step():
    p = predict(mode="autoreset", clips=10, cores=2, costs=LOADED, lengths=VARIED)
    assert p.sample_efficiency == pytest.approx(1.0)
    assert p.raw_tps == pytest.approx(p.effective_tps)
    assert p.mean_episode_length == pytest.approx(VARIED.mean)  # no episode is cut


def test_throughput_scales_with_cores_until_the_clips_run_out():
    kw = dict(mode="autoreset", clips=8, costs=FREE, lengths=fixed_lengths(length=12))
    rates = [predict(cores=c, **kw).effective_tps for c in (1, 2, 4, 8, 16)]
    assert rates[:4] == pytest.approx([100.0, 200.0, 400.0, 800.0])
    assert rates[4] == pytest.approx(rates[3])  # 16 cores, 8 clips: still 8 samplers
    dpsa = [
        predict(mode="dpsa", clips=64, cores=c, costs=LOADED, lengths=VARIED).effective_tps for c in (8, 64)
    ]
    assert 4.0 < dpsa[1] / dpsa[0] <= 8.0 + 1e-9  # more cores help, the barrier takes its share
    assert predict(
        mode="dpsa", clips=64, cores=128, costs=LOADED, lengths=VARIED
    ).effective_tps == pytest.approx(dpsa[1])


def test_more_samplers_than_cores_share_them():
    kw = dict(mode="autoreset", clips=8, costs=FREE, lengths=fixed_lengths(length=12))
    shared = predict(cores=2, workers=8, **kw)
    assert shared.cpu_stretch == pytest.approx(4.0, rel=1e-3)
    assert shared.effective_tps == pytest.approx(200.0, rel=1e-3)  # 2 cores' worth, not 8
    # Steps that wait (a sleep, a GPU) take no core: 8 samplers on 2 cores all run at full speed.
    waiting = replace(FREE, step_s=0.0, step_wait_s=0.01)
    assert predict(cores=2, workers=8, **(kw | {"costs": waiting})).effective_tps == pytest.approx(800.0)


def test_one_sampler_agrees_with_the_auto_thresholds_cost_model():
    """``ThresholdChooser`` predicts a cycle's effective throughput from the same counters; one sampler
    with no trainer (``path="single"``) must agree with it (both are Monte Carlo: within 3 %)."""
    chooser = ThresholdChooser(8, 60, seed=0)
    lengths = [3, 5, 8, 12, 20, 35, 50, 9, 4, 15, 22, 6, 7, 11, 30, 40] * 2
    cycle = CycleCosts(reset_s=0.2, step_s=0.5, other_s=0.01, rounds=50, env_steps=250)
    for i in range(0, len(lengths), 8):
        chooser.observe([(n, True) for n in lengths[i : i + 8]], cycle)
    costs = Costs.from_cycles([cycle], num_envs=8, load_s=0.2)
    assert costs.step_s == pytest.approx(2e-3) and costs.row_s == pytest.approx(2e-4)
    p = predict(
        mode="dpsa", clips=8, threshold=chooser.chosen, cores=1, path="single", max_horizon=60, costs=costs,
        lengths=observed_lengths([(n, True) for n in lengths], beyond=61),
    )  # fmt: skip
    assert p.effective_tps == pytest.approx(chooser.predicted["effective_tps"], rel=0.03)
    assert p.cut_share >= 0.0 and not math.isnan(p.round_cv["effective_tps"])


def test_reproduces_measured_cells_within_15_percent():
    """``benchmarks/results/sampling.md``: 10 clips over 2 sampler processes, 0.3 s scenario load."""
    cells = {c.label: c for c in current_cells()}
    for label in ("sgr x10", "dpsa@1 x10"):
        figures, _ = predicted(cells[label])
        measured = cells[label].measured["effective_tps"]
        assert figures["effective_tps"] == pytest.approx(measured, rel=0.15), label


def test_bad_cells_are_refused():
    with pytest.raises(ValueError, match="mode"):
        predict(mode="vector", clips=2, cores=1, costs=FREE, lengths=VARIED)
    with pytest.raises(ValueError, match="threshold"):
        predict(mode="dpsa", clips=2, cores=1, threshold=1.5, costs=FREE, lengths=VARIED)
