"""``benchmarks.overhead``: the settings it reads, its raw-ceiling workers and its report's sums."""

from __future__ import annotations

import pytest

from benchmarks.overhead import RawCeiling, TrainClock, breakdown, data_settings, markdown, parse_variant


def test_settings_come_from_the_config_then_overrides_then_defaults(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data:\n  class_path: fastlight.RolloutDataModule\n  init_args:\n    num_envs: 6\n")
    s = data_settings(str(cfg), ["--data.num_workers=3", "--model.lr=0.1"])
    assert s == {"env_id": "highway-fast-v0", "env_kwargs": {}, "workers": 3, "num_envs": 6}
    assert data_settings("configs/highway_dpsa.yaml", [])["num_envs"] == 8


def test_variants_parse_and_bad_ones_say_the_form():
    assert parse_variant("apart=--data.rank_rounds=apart --seed_everything=1") == (
        "apart",
        None,
        ["--data.rank_rounds=apart", "--seed_everything=1"],
    )
    assert parse_variant("config=") == ("config", None, [])
    assert parse_variant("here@.=--seed_everything=2") == ("here", ".", ["--seed_everything=2"])
    with pytest.raises(ValueError, match=r"--variants entries are NAME\[@DIR\]=OVERRIDES"):
        parse_variant("--data.rank_rounds=apart")
    with pytest.raises(ValueError, match="variant old: /nonexistent has no benchmarks/overhead.py"):
        parse_variant("old@/nonexistent=")


@pytest.mark.parametrize("kw", [{"warmup": 0}, {"batches": 4, "warmup": 4}])
def test_the_clock_refuses_an_empty_window(kw):
    with pytest.raises(ValueError, match="TrainClock needs 1 <= warmup < batches"):
        TrainClock(**kw)


def fit(valid: int, elapsed: float) -> dict:
    return {
        "valid_steps": valid, "raw_steps": valid, "elapsed_s": elapsed, "valid_tps": valid / elapsed,
        "update_s": 1.0, "step_time": 8.0, "reset_time": 1.0, "wall_time": 9.5,
        "cpu_s": {"trainer": 2.0, "sampler0": 9.0, "sampler1": 9.5},
    }  # fmt: skip


def test_breakdown_sums_the_windows_and_the_report_gives_each_variants_ratio():
    fits = [fit(100, 10.0), fit(300, 20.0)]
    b = breakdown(fits)
    assert b["window wall clock"] == 30.0
    assert b["samplers: CPU"] == 37.0 and b["trainer: CPU"] == 4.0
    assert b["samplers: rest of the cycles (policy forward, bookkeeping)"] == pytest.approx(1.0)
    # 2 x 9.5 s of cycles on 2 samplers over 10 + 20 s
    assert b["samplers: busy share (cycle time / (samplers x wall clock))"] == pytest.approx(19 / 60)
    summary = {
        "command": "x", "loadavg_start": 1.0, "loadavg_end": 2.0,
        "raw": [{"tps": 20.0}, {"tps": 15.0}], "raw_tps": 16.0,
        "variants": {"a": {"fits": fits, "fit_tps": 400 / 30, "ratio": 400 / 30 / 16, "breakdown": b}},
    }  # fmt: skip
    text = markdown(summary)
    assert "| 1 | 20.0 | 10.0 (50.0%) |" in text and "| 2 | 15.0 | 15.0 (100.0%) |" in text
    assert "**83.3%**, missed by 11.7 points" in text


@pytest.mark.slow  # two spawned processes (~14 s); every benchmarks.overhead run exercises them too
@pytest.mark.multiproc
def test_the_raw_ceiling_counts_every_workers_steps():
    ceiling = RawCeiling(env_id="CartPole-v1", env_kwargs={}, workers=2, num_envs=3)
    try:
        block = ceiling.block(0.3)
    finally:
        ceiling.close()
    assert block["steps"] > 2 * 3 * 10  # each worker stepped its 3 envs many times in 0.3 s
    assert block["elapsed_s"] >= 0.3 and block["tps"] == block["steps"] / block["elapsed_s"]
    assert 0 < block["reset_s"] < block["elapsed_s"] * 2
    assert all(not p.is_alive() for p in ceiling.procs)
