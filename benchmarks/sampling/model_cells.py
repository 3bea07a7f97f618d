"""The measured cells :mod:`benchmarks.sampling.model` is validated against: each with its settings, the
costs it was given (measured in that run, or the closest stated value, marked), and what was measured.

Sources (all in ``benchmarks/results``, or its history where said):

- ``sampling.md``: the current table (fastlight's sampler processes, 10 clips over 2 on 2 cores,
  highway-fast-v0 with a 0.3 s emulated scenario load): the primary cells;
- ``auto_threshold.md``: one Collector in one process, 8 envs, fixed DPSA thresholds;
- ``sampling.md`` as of commit ``81b9579`` (``git show 81b9579:benchmarks/results/sampling.json``): the
  superseded one-process table, the only measurement at 30 clips and of the shared simulator;
- ``overhead.md`` Run 3: the main job's share of the raw stepping ceiling, ``apart`` vs ``together``;
- ``fleet.md`` scaling: 1-16 samplers of a sleep-step env on 2 cores (more samplers than cores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.sampling.model import Costs, Lengths, Prediction, erlang_lengths, fixed_lengths, predict

#: Episode lengths of ``sampling.md`` (103 complete episodes of a random policy: mean 10.9,
#: p10/p50/p90 3/9/22, max 30 = the time limit, 4 % there): Erlang-2 below the limit, 4 % at it, fitted
#: to the mean (p10/p50/p90 3/9/21). The distribution itself is not stored in any results file.
HIGHWAY = erlang_lengths(mean=10.9, cap=30, limit_share=0.04)
#: ``81b9579``'s pool (104 episodes: mean 9.4, p10/p50/p90 4/8/17, max 30, 2 % at the limit): Erlang-3
#: below the limit (p10/p50/p90 4/8/16).
HIGHWAY_OLD = erlang_lengths(mean=9.4, cap=30, shape=3, limit_share=0.02)
#: ``auto_threshold.md``'s uneven env: 3 or 200 steps, even odds.
UNEVEN = Lengths((3, 200), (0.5, 0.5))

#: ``sampling.md`` costs: a global reset of 5 envs took 0.358-0.359 s in every dpsa/sgr cell = the 0.3 s
#: load + 5 x 11.8 ms of highway's own reset; "other" per row 0.63 ms (1 env) to 0.75-0.85 ms (5 envs);
#: the trainer's side of a round 3.4 ms (sequential: elapsed - busy = 0.048 s over its 14 rounds).
#: ``step_s`` is set per cell from that cell's own step time (``step_s / valid_steps``).
EMULATED = Costs(step_s=0.0371, load_s=0.3, reset_cpu_s=0.0118, row_s=6e-4, row_env_s=4e-5, round_s=3.4e-3)
#: ``81b9579``: highway's own reset 7.9 ms (sequential native: 0.70 ms/valid x 11.25 steps), "other"
#: 0.33 ms per 1-env row, ~0.5-0.65 ms per 10-30-env row; one process, so no trainer round.
OLD = Costs(step_s=0.0205, reset_cpu_s=0.0079, row_s=3.3e-4, row_env_s=1.2e-5, round_s=0.0)
#: ``81b9579``'s shared simulator: 15 ms ticks (a sleep; 15.22 ms measured), 0.3 s reloads one after another.
OLD_SHARED = replace(OLD, step_s=0.0, step_wait_s=0.01522, load_s=0.3, reset_cpu_s=0.0, shared_sim=True)


@dataclass(frozen=True)
class Cell:
    """One measured cell: ``cell`` are :func:`~benchmarks.sampling.model.predict`'s arguments,
    ``measured`` the figures by :class:`~benchmarks.sampling.model.Prediction` field name (``ratio``:
    effective throughput over the ``ceiling`` cell's), ``rounds`` how many rounds (cycles, collects)
    the measurement rests on."""

    table: str
    label: str
    cell: dict[str, Any]
    measured: dict[str, float]
    rounds: int
    ceiling: dict[str, Any] | None = None
    inputs: str = ""
    fitted: bool = False


def _label(mode: str, thr: float | None, clips: int) -> str:
    return f"{mode}@{thr:g} x{clips}" if mode == "dpsa" else f"{mode} x{clips}"


def current_cells() -> list[Cell]:
    """``sampling.md`` (procs path, 2 samplers on 2 cores, rank_rounds apart, 32 autoreset rows)."""
    rows = [  # mode, thr, clips, step ms, raw, effective, sample eff., time eff., busy, rounds
        ("sequential", None, 1, 37.11, 14.74, 14.74, 1.0, 0.5477, 0.998, 14),  # 448 valid / 32 a round
        ("sgr", None, 10, 37.03, 31.90, 31.90, 1.0, 0.6738, 0.876, 11),  # 22 global resets / 2 samplers
        ("autoreset", None, 10, 38.89, 29.65, 29.65, 1.0, 0.6237, 0.924, 2),  # 640 valid / (32 x 10)
        ("dpsa", 0.5, 10, 36.67, 43.72, 36.58, 0.8367, 0.7920, 0.847, 6),
        ("dpsa", 1.0, 10, 40.67, 81.24, 38.24, 0.4707, 0.8525, 0.912, 4),
    ]
    out = []
    for mode, thr, clips, step, raw, eff, se, te, busy, rounds in rows:
        cell = dict(mode=mode, clips=clips, threshold=thr or 0.5, cores=2, workers=2, rank_rounds="apart",
                    costs=replace(EMULATED, step_s=step / 1000), lengths=HIGHWAY)  # fmt: skip
        measured = dict(effective_tps=eff, raw_tps=raw, sample_efficiency=se, time_efficiency=te, busy=busy)
        out.append(Cell("sampling.md", _label(mode, thr, clips), cell, measured, rounds,
                        inputs=f"step {step:.2f} ms (this cell's)"))  # fmt: skip
    return out


def fit_cost(cell: dict[str, Any], *, field_name: str, effective_tps: float) -> Costs:
    """``cell``'s costs with ``field_name`` set so that the model gives ``effective_tps`` there (for a
    cost no results file states; the cell it is fitted to is marked and is no validation)."""
    lo, hi = math.log(1e-6), math.log(1.0)
    for _ in range(24):  # effective throughput falls as any cost grows
        mid = 0.5 * (lo + hi)
        costs = replace(cell["costs"], **{field_name: math.exp(mid)})
        lo, hi = (
            (mid, hi) if predict(**(cell | {"costs": costs})).effective_tps > effective_tps else (lo, mid)
        )
    return replace(cell["costs"], **{field_name: math.exp(0.5 * (lo + hi))})


def auto_threshold_cells() -> list[Cell]:
    """``auto_threshold.md``: one Collector (no trainer), 8 envs, max_horizon 250. No step cost is
    stated there: a per-row (uneven) or per-step (highway) cost is fitted to the 1.000 row of each env,
    the other rows are predictions."""
    data = {  # effective tps and cycles for thresholds 1/8 .. 8/8
        "uneven": ([118, 408, 1171, 2055, 2827, 2757, 3078, 3103], [120, 117, 111, 102, 93, 89, 86, 87]),
        "highway": ([17, 20, 22, 20, 19, 19, 24, 21], [16, 14, 12, 9, 8, 8, 9, 7]),
    }
    # uneven: a trivial env (20 us a step and a reset, stated), 0.2 s load per reset; the row cost fitted.
    # highway: native resets (11.8 ms, sampling.md's); the step cost fitted.
    setups = {
        "uneven": (Costs(step_s=2e-5, load_s=0.2, reset_cpu_s=2e-5, round_s=0.0), UNEVEN, "row_s"),
        "highway": (Costs(step_s=0.04, reset_cpu_s=0.0118, round_s=0.0), HIGHWAY, "step_s"),
    }
    out = []
    for env, (costs, lengths, field_name) in setups.items():
        base = dict(
            mode="dpsa", clips=8, cores=1, path="single", max_horizon=250, costs=costs, lengths=lengths
        )
        effs, cycles = data[env]
        fitted = fit_cost(base | {"threshold": 1.0}, field_name=field_name, effective_tps=effs[-1])
        value = getattr(fitted, field_name) * 1000
        for k in range(1, 9):
            cell = base | {"threshold": k / 8, "costs": fitted}
            out.append(Cell(f"auto_threshold.md {env}", f"dpsa@{k / 8:.3f} x8", cell,
                            {"effective_tps": effs[k - 1]}, cycles[k - 1], fitted=k == 8,
                            inputs=f"{field_name} {value:.3g} ms fitted to the 1.000 row"))  # fmt: skip
    return out


def old_cells() -> list[Cell]:
    """``git show 81b9579:benchmarks/results/sampling.json``: one process (``--path single``)."""
    # setting, mode, thr, clips, step ms, raw, effective, sample eff., time eff., rounds (cycle modes: the
    # global resets; autoreset/sequential: collects of 64 // clips rows, 720-768 valid steps = 12)
    rows = [
        ("native", "sequential", None, 1, 20.17, 47.17, 47.17, 1.0, 0.9513, 12),
        ("native", "sgr", None, 10, 20.04, 44.08, 44.08, 1.0, 0.8836, 17),
        ("native", "autoreset", None, 10, 20.22, 46.94, 46.94, 1.0, 0.9491, 12),
        ("native", "dpsa", 0.5, 10, 20.20, 54.74, 46.56, 0.8506, 0.9407, 10),
        ("native", "dpsa", 0.75, 10, 20.87, 73.18, 45.71, 0.6246, 0.9538, 8),
        ("native", "dpsa", 1.0, 10, 20.59, 110.6, 46.40, 0.4196, 0.9555, 7),
        ("native", "sgr", None, 30, 20.29, 40.67, 40.67, 1.0, 0.8251, 9),
        ("native", "autoreset", None, 30, 20.06, 45.18, 45.18, 1.0, 0.9065, 12),
        ("native", "dpsa", 0.5, 30, 20.21, 54.15, 45.04, 0.8318, 0.9104, 6),
        ("native", "dpsa", 0.75, 30, 20.17, 77.88, 46.37, 0.5953, 0.9354, 3),
        ("native", "dpsa", 1.0, 30, 20.17, 128.5, 46.60, 0.3625, 0.9400, 3),
        ("emulated", "sequential", None, 1, 21.08, 19.96, 19.96, 1.0, 0.4208, 12),
        ("emulated", "sgr", None, 10, 21.03, 30.62, 30.62, 1.0, 0.6441, 17),
        ("emulated", "autoreset", None, 10, 20.85, 25.75, 25.75, 1.0, 0.5369, 12),
        ("emulated", "dpsa", 0.5, 10, 19.94, 45.70, 38.87, 0.8506, 0.7751, 10),
        ("emulated", "dpsa", 0.75, 10, 20.14, 65.89, 41.16, 0.6246, 0.8289, 8),
        ("emulated", "dpsa", 1.0, 10, 20.31, 99.08, 41.57, 0.4196, 0.8442, 7),
        ("emulated", "sgr", None, 30, 20.31, 34.07, 34.07, 1.0, 0.6919, 9),
        ("emulated", "autoreset", None, 30, 21.08, 31.06, 31.06, 1.0, 0.6547, 12),
        ("emulated", "dpsa", 0.5, 30, 21.04, 48.33, 40.20, 0.8318, 0.8459, 6),
        ("emulated", "dpsa", 0.75, 30, 21.24, 69.67, 41.48, 0.5953, 0.8810, 3),
        ("emulated", "dpsa", 1.0, 30, 20.73, 119.0, 43.13, 0.3625, 0.8940, 3),
        ("shared", "sequential", None, 1, 15.22, 20.24, 20.24, 1.0, 0.3081, 12),
        ("shared", "sgr", None, 10, 15.22, 12.44, 12.44, 1.0, 0.01890, 16),
        ("shared", "dpsa", 0.5, 10, 15.22, 24.15, 21.27, 0.8807, 0.03669, 11),
        ("shared", "dpsa", 0.75, 10, 15.22, 38.67, 26.76, 0.6919, 0.05882, 8),
        ("shared", "dpsa", 1.0, 10, 15.22, 55.53, 28.81, 0.5188, 0.08444, 7),
        ("shared", "sgr", None, 30, 15.22, 8.833, 8.833, 1.0, 0.004556, 9),
        ("shared", "dpsa", 0.5, 30, 15.22, 27.87, 23.72, 0.8510, 0.01419, 4),
        ("shared", "dpsa", 0.75, 30, 15.22, 41.22, 29.00, 0.7035, 0.02106, 3),
        ("shared", "dpsa", 1.0, 30, 15.22, 75.64, 31.57, 0.4174, 0.03839, 3),
    ]
    out = []
    for setting, mode, thr, clips, step, raw, eff, se, te, rounds in rows:
        if setting == "shared":
            costs = OLD_SHARED
        else:
            costs = replace(OLD, step_s=step / 1000, load_s=0.3 if setting == "emulated" else 0.0)
        cell = dict(mode=mode, clips=clips, threshold=thr or 0.5, cores=1, path="single", costs=costs,
                    lengths=HIGHWAY_OLD, rollout_steps=max(1, 64 // clips))  # fmt: skip
        measured = dict(effective_tps=eff, raw_tps=raw, sample_efficiency=se, time_efficiency=te)
        inputs = "tick 15.22 ms (measured)" if setting == "shared" else f"step {step:.2f} ms (this cell's)"
        out.append(
            Cell(f"81b9579 {setting}", _label(mode, thr, clips), cell, measured, rounds, inputs=inputs)
        )
    return out


def overhead_cells() -> list[Cell]:
    """``overhead.md`` Run 3: ``configs/highway_dpsa.yaml`` (8 clips over 2 samplers, dpsa 0.5, 2 cycles
    per step) against the raw ceiling (2 processes x 4 envs, autoreset, no trainer). The trainer's update,
    7.65 s over the 36 measured rounds, is the round's 0.21 s. The training policy's episode lengths are
    not stated; its Rollouts held 281 valid steps with the rank-wide cut (Run 1): Erlang-2 lengths of mean
    23 with 10 % at the 30-step limit give that (a random policy's give 122), so they are used (fitted)."""
    costs = replace(EMULATED, load_s=0.0, round_s=0.215)
    trained = erlang_lengths(mean=23.0, cap=30, limit_share=0.1)
    ceiling = dict(mode="autoreset", clips=4, cores=1, path="single", costs=costs, lengths=trained,
                   rollout_steps=128, extra_factor=2.0)  # fmt: skip
    out = []
    for rounds, ratio, busy in (("apart", 0.910, 0.896), ("together", 0.948, 0.984)):
        cell = dict(mode="dpsa", clips=8, threshold=0.5, cores=2, workers=2, cycles_per_round=2,
                    rank_rounds=rounds, costs=costs, lengths=trained)  # fmt: skip
        measured = {"ratio": ratio, "busy": busy}
        inputs = "lengths fitted to Run 1's 281 valid steps a batch"
        out.append(
            Cell(
                "overhead.md Run 3",
                f"dpsa@0.5 x8 {rounds}",
                cell,
                measured,
                36,
                ceiling=ceiling,
                inputs=inputs,
            )
        )
    return out


def fleet_cells() -> list[Cell]:
    """``fleet.md`` scaling: a sleep-step env (10 ms sleep a step, 40-step episodes), 2 envs per sampler,
    ``max_horizon`` 40, 1-16 samplers on 2 cores (Ray, 1 node; the local fleet at 8 and 16). The CPU per
    row is fitted to the 1-sampler point (all of a row's time beyond the sleeps taken as CPU)."""
    base = dict(mode="dpsa", clips=2, threshold=0.5, cores=2, workers=1, max_horizon=40,
                lengths=fixed_lengths(length=40),
                costs=Costs(step_s=0.0, step_wait_s=0.01, row_env_s=0.0, round_s=3.4e-3))  # fmt: skip
    costs = fit_cost(base, field_name="row_s", effective_tps=86.0)
    out = []
    for samplers, rate in ((1, 86), (2, 172), (4, 336), (8, 637), (16, 1077), (8, 665), (16, 1227)):
        fleet = "local" if (samplers, rate) in ((8, 665), (16, 1227)) else "Ray"
        cell = dict(mode="dpsa", clips=2 * samplers, threshold=0.5, cores=2, workers=samplers, max_horizon=40,
                    costs=costs, lengths=fixed_lengths(length=40))  # fmt: skip
        out.append(Cell("fleet.md scaling", f"{samplers} samplers ({fleet})", cell, {"effective_tps": rate},
                        20, fitted=samplers == 1 and fleet == "Ray",
                        inputs=f"row_s {costs.row_s * 1000:.2f} ms fitted to 1 sampler"))  # fmt: skip
    return out


def all_cells() -> list[Cell]:
    return current_cells() + auto_threshold_cells() + overhead_cells() + fleet_cells() + old_cells()


def predicted(cell: Cell) -> tuple[dict[str, float], Prediction]:
    """The model's figures for ``cell`` (``ratio`` against its ceiling when it has one)."""
    p = predict(**cell.cell)
    out = {k: float(v) for k, v in vars(p).items() if isinstance(v, float)}
    if cell.ceiling is not None:
        spec = dict(cell.ceiling)
        factor = spec.pop("extra_factor", 1.0)
        out["ratio"] = p.effective_tps / (factor * predict(**spec).effective_tps)
    return out, p


def noise(cell: Cell, prediction: Prediction, key: str) -> float:
    """The relative standard error the measured ``key`` has by chance alone, as the model sees it: one
    round's spread (``Prediction.round_cv``) over the square root of the rounds it rests on."""
    return prediction.round_cv.get(key, math.nan) / math.sqrt(max(cell.rounds, 1))
