"""The sampling benchmark on tiny settings, in-process: outputs, invariants, and the models."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from time import sleep as real_sleep
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from benchmarks.sampling import report as sampling_report
from benchmarks.sampling.__main__ import main, plan
from benchmarks.sampling.report import TITLES
from benchmarks.sampling.runs import (
    BenchEnv,
    EpisodeLengths,
    RandomPolicy,
    RunSpec,
    RunTotals,
    drain,
    run_spec,
)
from benchmarks.sampling.shared_sim import shared_sim_clips
from fastlight.envs import scenario_cost
from fastlight.sampling.collector import Collector
from fastlight.sampling.resets import POOL_RESET_S
from tests.fake_envs import FixedLengthEnv

KEYS = {"mode", "threshold", "clips", "reset_cost_s", "raw_tps", "effective_tps", "sample_efficiency",
        "time_efficiency", "mean_episode_length", "speedup_vs_sequential"}
RESET = 0.02


class RandomLengthEnv(gym.Env):
    """Episodes of 1..12 steps drawn from the env's seeded RNG; crash (terminate) unless 12."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.t, self.n = 0, 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.n = 0, int(self.np_random.integers(1, 13))
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.n
        return np.zeros(3, np.float32), 1.0, end and self.n < 12, end and self.n == 12, {}


gym.register("BenchRandomLength-v0", entry_point=RandomLengthEnv)


FIGURES: list[Figure] = []  # what sampling_report.plot drew during the module's bench run


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    out = tmp_path_factory.mktemp("bench")
    argv = ["--path", "single", "--env", "BenchRandomLength-v0", "--clips", "1", "4", "--valid-steps", "60",
            "--rounds", "2",
            "--reset-cost", str(RESET), "--shared-step-s", "0.002", "--out", str(out)]
    plot = sampling_report.plot
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampling_report, "plot", lambda *a, **kw: FIGURES.append(plot(*a, **kw)))
        return main(argv), out


def _row(rows: list[dict], setting: str, mode: str, clips: int, threshold: float | None = None) -> dict:
    return next(r for r in rows if (r["setting"], r["mode"], r["clips"], r["threshold"])
                == (setting, mode, clips, threshold))


def test_outputs_and_json_keys(bench: tuple[list[dict], Path]) -> None:
    rows, out = bench
    on_disk = json.loads((out / "sampling.json").read_text())
    assert isinstance(on_disk, list) and len(on_disk) == len(plan(
        ["native", "emulated_reset", "shared_sim"], [1, 4], [0.5, 0.75, 1.0]))
    assert all(KEYS <= set(r) for r in on_disk)
    md = (out / "sampling.md").read_text()
    assert "python -m benchmarks.sampling --path single --env BenchRandomLength-v0" in md
    assert "## Targets" in md and "shared simulator" in md
    assert not any(r["mode"] == "autoreset" for r in rows if r["setting"] == "shared_sim")


def test_plot_shows_each_rows_effective_throughput(bench: tuple[list[dict], Path]) -> None:
    rows, out = bench
    assert (out / "sampling.png").is_file()
    (fig,) = FIGURES
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert list(panels) == [TITLES[s] for s in ("native", "emulated_reset", "shared_sim")]
    dpsa = {"dpsa@0.5": 0.5, "dpsa@0.75": 0.75, "dpsa@1": 1.0}
    colors: dict[str, str] = {}
    for setting in ("native", "emulated_reset", "shared_sim"):
        ax = panels[TITLES[setting]]
        assert ax.get_xlabel() == "parallel clips"
        assert ax.get_ylabel() == "effective throughput (valid transitions / s)"
        assert ax.get_ylim()[0] == 0 and list(ax.get_xticks()) == [1, 4]
        lines = {line.get_label(): line for line in ax.get_lines()}
        modes = ["sgr", "autoreset"] if setting != "shared_sim" else ["sgr"]
        assert sorted(lines) == sorted(["sequential", *modes, *dpsa])
        # The sequential baseline is a horizontal line at its effective throughput ...
        seq = _row(rows, setting, "sequential", 1)["effective_tps"]
        np.testing.assert_allclose(lines["sequential"].get_ydata(), [seq, seq])
        # ... and every mode a line through its rows' effective throughput at 1 and 4 clips.
        for name in [*modes, *dpsa]:
            mode, threshold = ("dpsa", dpsa[name]) if name in dpsa else (name, None)
            want = [_row(rows, setting, mode, c, threshold)["effective_tps"] for c in (1, 4)]
            np.testing.assert_array_equal(lines[name].get_xdata(), [1, 4])
            np.testing.assert_allclose(lines[name].get_ydata(), want, rtol=1e-12)
            assert colors.setdefault(name, lines[name].get_color()) == lines[name].get_color()  # same colour
        assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == sorted(lines)
    assert len(set(colors.values())) == len(colors)  # one colour per mode


def test_invariants(bench: tuple[list[dict], Path]) -> None:
    rows, _ = bench
    for r in rows:
        assert r["valid_steps"] >= 60
        assert r["effective_tps"] == pytest.approx(r["raw_tps"] * r["sample_efficiency"])
        assert 0.0 < r["time_efficiency"] <= 1.0
        if r["mode"] == "dpsa":
            assert r["sample_efficiency"] <= 1.0
        else:
            assert r["sample_efficiency"] == 1.0
        if r["mode"] == "sequential":
            assert r["speedup_vs_sequential"] == 1.0
    for setting in ("native", "emulated_reset", "shared_sim"):
        assert _row(rows, setting, "dpsa", 4, 1.0)["sample_efficiency"] < 1.0  # dummy steps


def test_one_clip_rows_share_the_identical_run(bench: tuple[list[dict], Path]) -> None:
    rows, _ = bench
    sgr = _row(rows, "native", "sgr", 1)
    dpsa = _row(rows, "native", "dpsa", 1, 0.5)
    assert dpsa["same_as"] and dpsa["effective_tps"] == sgr["effective_tps"]
    assert _row(rows, "native", "autoreset", 1)["same_as"]
    zero = RunSpec("native", "dpsa", 1, 0.0)  # threshold 0 cuts after one step: a different run
    assert zero.canonical() == zero


def test_sgr_cuts_episodes_short(bench: tuple[list[dict], Path]) -> None:
    rows, _ = bench
    seq = _row(rows, "native", "sequential", 1)["mean_episode_length"]
    assert _row(rows, "native", "sgr", 4)["mean_episode_length"] < 0.8 * seq
    assert _row(rows, "native", "sgr", 4)["truncated_episode_share"] > 0.3


def test_reset_models(bench: tuple[list[dict], Path]) -> None:
    rows, _ = bench
    # Lower bounds only (a loaded machine can only make resets slower): every global reset
    # waits for at least one emulated load ...
    real = _row(rows, "emulated_reset", "sgr", 4)
    assert real["global_resets"] >= 1 and real["reset_s"] >= real["global_resets"] * RESET * 0.95
    # ... and the shared simulator reloads its 4 clips one after another. That the emulated
    # loads of one sampler overlap is checked without a clock below.
    shared = _row(rows, "shared_sim", "sgr", 4)
    assert shared["reset_s"] / shared["global_resets"] >= 4 * RESET * 0.95


def test_emulated_resets_of_one_sampler_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each emulated load waits at a 4-party barrier instead of sleeping: the 4 envs' loads of a
    # global reset only get through if they run at the same time (else BrokenBarrierError).
    barrier, loads = threading.Barrier(4, timeout=30), []  # the timeout only guards against a hang

    def load(seconds: float) -> None:
        loads.append(seconds)
        barrier.wait()
        # A real load takes time: the Collector keeps resets on its pool only while one costs more
        # than POOL_RESET_S (cheaper ones run inline), so the emulated one must too.
        real_sleep(2 * POOL_RESET_S)

    monkeypatch.setattr(scenario_cost, "time", SimpleNamespace(sleep=load))
    be = BenchEnv(env_id="BenchRandomLength-v0", reset_cost_s=RESET)
    totals = RunTotals()
    run_spec(RunSpec("emulated_reset", "sgr", 4), be, valid_steps=30, seed=0, totals=totals)
    global_resets = int(totals.metric.totals()["global_resets"])
    assert global_resets >= 2
    assert loads == [RESET] * (4 * global_resets)  # every reset of every env loads, 4 at a time


def test_shared_simulator_steps_clips_in_one_tick() -> None:
    clips = shared_sim_clips(
        5, [(2, True), (7, True), (12, False)], step_s=0.0, reset_s=0.0,
        observation_space=gym.spaces.Box(-1, 1, (3,)), action_space=gym.spaces.Discrete(2),
    )
    collector = Collector(clips, mode="dpsa", termination_threshold=1.0, max_horizon=50)
    rollout = collector.collect(RandomPolicy(2))
    sim = clips[0].sim
    assert sim.ticks == rollout.shape[0]  # one tick per row, however many clips are active
    assert sim.scenario_loads == 5
    assert int(rollout.valid.sum()) == sum(ep.length for ep in rollout.stats.episodes)


def test_drain_finishes_running_episodes() -> None:
    env = EpisodeLengths(FixedLengthEnv(lengths=(5, 3)))
    env.reset(seed=0)
    env.step(0)
    env.step(0)
    drain([env], seed=0)
    assert env.ended == [(5, True)] and not env.running


def test_random_policy_is_uniform_and_seeded() -> None:
    a = RandomPolicy(4, seed=1).act(torch.zeros(4000, 3))
    b = RandomPolicy(4, seed=1).act(torch.zeros(4000, 3))
    assert torch.equal(a.actions, b.actions)
    counts = torch.bincount(a.actions, minlength=4).float() / 4000
    assert torch.allclose(counts, torch.full((4,), 0.25), atol=0.03)
    assert torch.equal(a.values, torch.zeros(4000))


def test_lengths_only_runs_the_real_setting_as_the_shared_simulators_lengths(tmp_path) -> None:
    argv = ["--path", "single", "--env", "BenchRandomLength-v0", "--settings", "native", "shared_sim",
            "--lengths-only", "50", "--clips", "1", "4", "--thresholds", "1.0", "--valid-steps", "40",
            "--rounds", "1",
            "--shared-step-s", "0.002", "--out", str(tmp_path)]  # fmt: skip
    rows = main(argv)
    [native] = [r for r in rows if r["setting"] == "native"]
    assert (native["mode"], native["clips"]) == ("sequential", 1) and 50 <= native["valid_steps"] < 50 + 40
    shared = {(r["mode"], r["clips"]) for r in rows if r["setting"] == "shared_sim"}
    assert shared == {("sequential", 1), ("sgr", 1), ("sgr", 4), ("dpsa", 1), ("dpsa", 4)}
    with pytest.raises(SystemExit, match="--lengths-only needs --settings shared_sim"):
        main(["--path", "single", "--settings", "native", "--lengths-only", "9", "--out", str(tmp_path)])
