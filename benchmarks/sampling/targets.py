"""The sampling benchmark's targets (met / missed) and the arithmetic that explains them.

Targets are judged on setting ``emulated_reset`` (real stepping, emulated scenario load) and,
for FAST's shared-simulator claims (FAST §execution time: SGR-30 < 1×, FAST-30 > 2×), on
``shared_sim``. The explanations are ceilings computed from the measured time profile: in a
single sampler process the envs are stepped one after another, so every valid transition
costs at least one real ``env.step``, whatever the reset mode.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

Row = dict[str, Any]
REAL = "emulated_reset"


def _get(rows: list[Row], setting: str, mode: str, clips: int, threshold: float | None = None) -> Row | None:
    for r in rows:
        if (r["setting"], r["mode"], r["clips"]) == (setting, mode, clips) and (
            threshold is None or r["threshold"] == threshold
        ):
            return r
    return None


def _best_dpsa(rows: list[Row], setting: str, clips: int) -> Row | None:
    cands = [r for r in rows if (r["setting"], r["mode"], r["clips"]) == (setting, "dpsa", clips)]
    return max(cands, key=lambda r: r["effective_tps"]) if cands else None


def _line(ok: bool | None, target: str, measured: str) -> str:
    tag = "not run" if ok is None else ("**met**" if ok else "**MISSED**")
    return f"- {tag}: {target} — {measured}"


def _ratio_target(rows: list[Row], clips: int, need: float) -> str:
    d, s = _best_dpsa(rows, REAL, clips), _get(rows, REAL, "sgr", clips)
    target = f"{clips} clips: best dpsa ≥ {need}× sgr effective throughput"
    if d is None or s is None:
        return _line(None, target, "")
    ratio = d["effective_tps"] / s["effective_tps"]
    return _line(ratio >= need, target, f"dpsa@{d['threshold']:g} {d['effective_tps']:.1f} vs sgr "
                 f"{s['effective_tps']:.1f} valid/s = {ratio:.2f}×")


def _length_lines(rows: list[Row]) -> list[str]:
    seq = _get(rows, REAL, "sequential", 1)
    out = []
    for clips in sorted({r["clips"] for r in rows if r["clips"] > 1}):
        d, s = _get(rows, REAL, "dpsa", clips, 1.0), _get(rows, REAL, "sgr", clips)
        if seq is None or d is None or seq["mean_episode_length"] is None:
            continue
        lq, ld = seq["mean_episode_length"], d["mean_episode_length"] or math.nan
        se = math.hypot(seq["mean_episode_length_se"] or 0.0, d["mean_episode_length_se"] or 0.0)
        z = abs(ld - lq) / se if se else math.nan
        noise = "within noise" if z < 2 else "significant"
        out.append(_line(abs(ld / lq - 1) <= 0.05, f"{clips} clips: dpsa@1 mean episode length within 5% "
                         f"of sequential", f"{ld:.2f} vs {lq:.2f} ({ld / lq - 1:+.1%}; difference "
                         f"{z:.1f} standard errors, {noise})"))
        if s is not None and s["mean_episode_length"] is not None:
            shrink = 1 - s["mean_episode_length"] / lq
            out.append(_line(shrink > 0, f"{clips} clips: sgr's mean episode length shrinks",
                             f"{s['mean_episode_length']:.2f} vs {lq:.2f}: {shrink:.0%} shorter"))
    return out


def target_lines(rows: list[Row]) -> list[str]:
    """One line per target of the issue, with the measured figures."""
    out = [_ratio_target(rows, 10, 1.5)]
    d = _best_dpsa(rows, REAL, 10)
    # Sampler processes (the real path) are held to FAST's 3×; one process to its old, higher bar.
    need = 3.0 if rows and rows[0].get("path") == "procs" else 3.5
    out.append(_line(None if d is None else d["speedup_vs_sequential"] >= need,
                     f"10 clips: best dpsa ≥ {need:g}× sequential",
                     "" if d is None else f"{d['speedup_vs_sequential']:.2f}×"))
    out.append(_ratio_target(rows, 30, 1.25))
    s = _get(rows, REAL, "sgr", 10)
    te = None if d is None or s is None else d["time_efficiency"] - s["time_efficiency"]
    out.append(_line(None if te is None else te >= 0.2, "10 clips: dpsa time efficiency ≥ sgr + 0.2",
                     "" if te is None else f"{d['time_efficiency']:.3f} vs {s['time_efficiency']:.3f} "
                     f"({te:+.3f})"))
    out += _length_lines(rows)
    sg, dp = _get(rows, "shared_sim", "sgr", 30), _best_dpsa(rows, "shared_sim", 30)
    out.append(_line(None if sg is None else sg["speedup_vs_sequential"] < 1.0, "shared simulator, 30 clips: "
                     "sgr < 1× sequential", "" if sg is None else f"{sg['speedup_vs_sequential']:.2f}×"))
    out.append(_line(None if dp is None else dp["speedup_vs_sequential"] > 2.0, "shared simulator, 30 clips: "
                     "dpsa > 2× sequential", "" if dp is None else
                     f"dpsa@{dp['threshold']:g} {dp['speedup_vs_sequential']:.2f}×"))
    return out


def _per_valid(r: Row, key: str) -> float:
    return r[key] / max(r["valid_steps"], 1)


def _ms(r: Row) -> str:
    """Step / reset / other milliseconds per valid transition."""
    return "/".join(f"{_per_valid(r, k) * 1e3:.1f}" for k in ("step_s", "reset_s", "other_s"))


def _serial_line(rows: list[Row], seq: Row, best10: Row | None) -> str:
    cells = [_per_valid(r, "step_s") for r in rows if r["setting"] == REAL and not r["same_as"]]
    step = float(np.median(cells))  # the load-neutral cost of one real step
    overhead = _per_valid(seq, "reset_s") + _per_valid(seq, "other_s")
    ceil = 1.0 + overhead / step
    reached = "" if best10 is None else (
        f" The best 10-clip dpsa reaches {best10['speedup_vs_sequential']:.2f}×, "
        f"{best10['speedup_vs_sequential'] / ceil:.0%} of that ceiling"
        + (" - above it, so the machine's load changed between those cells (see the profile)."
           if best10["speedup_vs_sequential"] > ceil else ".")
    )
    return (
        f"- **Serial stepping caps every speed-up with real stepping.** One `env.step` costs "
        f"{min(cells) * 1e3:.1f}-{max(cells) * 1e3:.1f} ms across cells (median {step * 1e3:.1f} ms) and "
        f"every valid transition needs one, in every mode, on one core (highway-env is pure Python; "
        f"the Collector steps its envs one after another). Besides stepping, sequential spends "
        f"{overhead * 1e3:.1f} ms per valid transition (resets and bookkeeping), so no mode can beat "
        f"it by more than 1 + {overhead * 1e3:.1f} / {step * 1e3:.1f} = {ceil:.2f}×.{reached} FAST's "
        "10-clip speed-up comes from clips stepping in parallel on 8 GPUs; ≥ 3.5× needs that, or "
        "several sampler processes. (The targets assumed a ~15 ms step, 0.3 s ≈ 20× a step; a "
        "slower step on this shared machine lowers the reset share and with it every ceiling.)"
    )


def _vs_sgr_line(clips: int, d: Row, s: Row) -> str:
    ceil = _per_valid(s, "wall_s") / _per_valid(d, "step_s")
    per_reset = s["reset_s"] / max(s["global_resets"], 1)
    d_cap = d["step_s"] / (d["step_s"] + d["reset_s"])
    return (
        f"- **{clips} clips, dpsa@{d['threshold']:g} vs sgr** (ms per valid transition, "
        f"step/reset/other): sgr {_ms(s)}, dpsa {_ms(d)}. A global reset of {clips} envs costs sgr "
        f"{per_reset:.2f} s, not {clips} × {s['reset_cost_s']:g} s: the emulated loads of one sampler "
        f"overlap on its thread pool, so it is one load plus {clips} real (CPU-bound) environment "
        f"resets. So sgr pays a reset per {s['valid_steps'] / max(s['global_resets'], 1):.0f} "
        f"valid transitions, dpsa one per {d['valid_steps'] / max(d['global_resets'], 1):.0f}. "
        f"Even with no resets at all dpsa could reach {ceil:.2f}× sgr; it reaches "
        f"{d['effective_tps'] / s['effective_tps']:.2f}×, the rest being its own once-per-cycle "
        f"load. That load also caps dpsa's time efficiency at step / (step + reset) = {d_cap:.3f} "
        f"(measured {d['time_efficiency']:.3f}, sgr {s['time_efficiency']:.3f})."
    )


def _real_ceiling(rows: list[Row]) -> list[str]:
    seq = _get(rows, REAL, "sequential", 1)
    if seq is None:
        return []
    out = [_serial_line(rows, seq, _best_dpsa(rows, REAL, 10))]
    for clips in sorted({r["clips"] for r in rows if r["clips"] > 1}):
        d, s = _best_dpsa(rows, REAL, clips), _get(rows, REAL, "sgr", clips)
        if d is not None and s is not None:
            out.append(_vs_sgr_line(clips, d, s))
    rel = (seq["mean_episode_length_se"] or math.nan) / (seq["mean_episode_length"] or math.nan)
    out.append(
        f"- **Episode lengths** vary a lot, so sequential's mean over its {seq['episodes']} episodes "
        f"has a standard error of {rel:.0%}: a 5% tolerance cannot be resolved at this size, and "
        "the targets above give each difference in standard errors. (a) and (b) use the same seeds "
        "and so replay the same episodes: their lengths are identical by construction."
    )
    return out


def _shared_ceiling(rows: list[Row], meta: dict[str, Any]) -> list[str]:
    seq = _get(rows, "shared_sim", "sequential", 1)
    if seq is None or not seq["mean_episode_length"]:
        return []
    reset, tick, length = meta["reset_cost_s"], meta["shared_step_s"], seq["mean_episode_length"]
    ceil = (reset + length * tick) / reset if reset > 0 else math.inf
    out = [
        f"- **Shared simulator.** Reloads are serialised, so every episode costs one full {reset:g} s "
        f"reload in every mode; parallel clips save only stepping time. A clip's episode steps for "
        f"{length:.2f} × {tick * 1e3:.1f} ms = {length * tick:.2f} s against a {reset:g} s reload, so "
        f"at equal episode lengths no clip count can beat sequential by more than "
        f"1 + {length * tick:.2f} / {reset:g} = {ceil:.2f}×.",
    ]
    best = _best_dpsa(rows, "shared_sim", 30) or _best_dpsa(rows, "shared_sim", 10)
    if best is not None and best["mean_episode_length"]:
        own = ceil * best["mean_episode_length"] / length  # one reload per episode of its own length
        out.append(
            f"  dpsa@{best['threshold']:g} at {best['clips']} clips replayed episodes of mean "
            f"{best['mean_episode_length']:.2f} steps (sequential {length:.2f}: sampling noise), which "
            f"moves its ceiling to {own:.2f}×; it reaches {best['speedup_vs_sequential']:.2f}×."
        )
    out.append(
        "  FAST's > 2× at 30 clips implies episodes whose simulated time exceeds a clip's reload "
        "(FAST's episodes average ~35 steps of a heavier simulator); highway-env's short, mostly "
        "crash-ended random-policy episodes against a 0.3 s reload cannot show it in this model. "
        "SGR's collapse below 1× does not depend on that: it pays N serial reloads for about "
        "N × (shortest of N episodes) transitions."
    )
    return out


def _procs_lines(rows: list[Row], meta: dict[str, Any]) -> list[str]:
    """Sampler processes: what a sequential sampler spends, and how busy the parallel ones were."""
    seq = _get(rows, REAL, "sequential", 1)
    if seq is None:
        return []
    cells = [_per_valid(r, "step_s") for r in rows if r["setting"] == REAL and not r["same_as"]]
    step = float(np.median(cells))
    w = meta["workers"]
    cores = os.cpu_count() or 1
    out = [
        f"- **Ceiling.** One `env.step` costs {min(cells) * 1e3:.1f}-{max(cells) * 1e3:.1f} ms across "
        f"cells (median {step * 1e3:.1f} ms); with {w} sampler process(es) on {cores} core(s) no mode "
        f"can exceed {min(w, cores)} / {step * 1e3:.1f} ms = {min(w, cores) / step:.0f} valid/s. "
        f"Sequential spends {_ms(seq)} ms per valid transition (step/reset/other) in its one process, "
        f"so {seq['effective_tps']:.1f} valid/s."
    ]
    for clips in sorted({r["clips"] for r in rows if r["clips"] > 1 and r["setting"] == REAL}):
        d, s = _best_dpsa(rows, REAL, clips), _get(rows, REAL, "sgr", clips)
        if d is None or s is None:
            continue
        out.append(
            f"- **{clips} clips** over {d['workers']} processes (ms per valid transition, summed over "
            f"processes, step/reset/other): sgr {_ms(s)}, dpsa@{d['threshold']:g} {_ms(d)}; samplers "
            f"busy {s['wall_s'] / max(s['workers'] * s['elapsed_s'], 1e-9):.0%} (sgr) and "
            f"{d['wall_s'] / max(d['workers'] * d['elapsed_s'], 1e-9):.0%} (dpsa) of the wall clock. "
            f"sgr pays a global reset per {s['valid_steps'] / max(s['global_resets'], 1):.0f} valid "
            f"transitions, dpsa one per {d['valid_steps'] / max(d['global_resets'], 1):.0f}."
        )
    out.append(
        "- Machine load (the load averages above) moves these figures: a busy core slows the "
        "samplers' stepping, and more so the multi-process cells, which need every core at once; "
        "compare tables measured on an idle machine."
    )
    return out


def analysis_lines(rows: list[Row], meta: dict[str, Any]) -> list[str]:
    """The measured ceilings behind the met / missed targets."""
    if meta.get("path") == "procs":
        return _procs_lines(rows, meta)
    return [*_real_ceiling(rows), *_shared_ceiling(rows, meta)]
