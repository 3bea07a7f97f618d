"""Statistics of the objectives study, with rliable (Agarwal et al. 2021), as AcceRL Table 9 reports.

Scores are normalised per env between a random policy's score (0) and a reference (1): the best
score any run of the grid reached on that env (any variant, seed and lag). Aggregates over the
``runs x envs`` matrix of each variant: IQM (25% trimmed mean) and mean, each with a
stratified-bootstrap 95% CI; probability of improvement of one variant over another, with CI.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping, Sequence

import numpy as np

from fastlight.extras import check_extra

check_extra("rliable", "scipy", extra="bench", what="python -m benchmarks.objectives")


def _import_rliable_library():
    """``rliable.library``, whose bootstrap comes from ``arch``.

    arch <= 7.2 decorates a method with pandas' private ``deprecate_kwarg(old, new)``, which pandas 3
    changed to ``deprecate_kwarg(klass, old, new)``: importing arch then fails at class definition.
    While arch is imported, the pandas-2 call form is mapped onto the pandas-3 one (FutureWarning,
    pandas 2's class); nothing else changes, and the original is put back at once.
    """
    from pandas.util import _decorators

    original = _decorators.deprecate_kwarg
    if "klass" not in inspect.signature(original).parameters:
        return importlib.import_module("rliable.library")

    def pandas2_form(old_arg_name, new_arg_name, *args, **kwargs):  # noqa: ANN001, ANN202
        if isinstance(old_arg_name, type):  # already the pandas-3 form
            return original(old_arg_name, new_arg_name, *args, **kwargs)
        return original(FutureWarning, old_arg_name, new_arg_name, *args, **kwargs)

    _decorators.deprecate_kwarg = pandas2_form
    try:
        return importlib.import_module("rliable.library")
    finally:
        _decorators.deprecate_kwarg = original


rly = _import_rliable_library()
from rliable import metrics  # noqa: E402


def normalise(score: float, random: float, reference: float) -> float:
    """``(score - random) / (reference - random)``: 0 = random policy, 1 = the reference."""
    span = reference - random
    if span == 0:
        raise ValueError(f"normalise: reference {reference} equals the random score; nothing to scale by")
    return (score - random) / span


def score_matrix(
    scores: Mapping[tuple[str, str, int], float],
    *,
    variants: Sequence[str],
    envs: Sequence[str],
    seeds: Sequence[int],
) -> dict[str, np.ndarray]:
    """``{variant: array [len(seeds), len(envs)]}`` from ``{(variant, env, seed): score}``."""
    return {
        v: np.array([[scores[(v, env, seed)] for env in envs] for seed in seeds], dtype=np.float64)
        for v in variants
    }


def _iqm_and_mean(x: np.ndarray) -> np.ndarray:
    return np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x)])


def aggregate(
    score_dict: Mapping[str, np.ndarray], *, reps: int = 2000, seed: int = 0
) -> dict[str, dict[str, float]]:
    """IQM and mean with stratified-bootstrap 95% CIs per variant (rliable)."""
    points, cis = rly.get_interval_estimates(
        dict(score_dict), _iqm_and_mean, reps=reps, random_state=np.random.RandomState(seed)
    )
    return {
        v: {
            "iqm": float(points[v][0]),
            "iqm_ci": [float(cis[v][0, 0]), float(cis[v][1, 0])],
            "mean": float(points[v][1]),
            "mean_ci": [float(cis[v][0, 1]), float(cis[v][1, 1])],
        }
        for v in score_dict
    }


def improvement(
    score_dict: Mapping[str, np.ndarray], x: str, y: str, *, reps: int = 2000, seed: int = 0
) -> dict[str, float]:
    """P(x > y), averaged over envs (Mann-Whitney per env), with a stratified-bootstrap 95% CI."""
    points, cis = rly.get_interval_estimates(
        {f"{x}>{y}": [score_dict[x], score_dict[y]]},
        lambda a, b: np.array([metrics.probability_of_improvement(a, b)]),
        reps=reps,
        random_state=np.random.RandomState(seed),
    )
    key = f"{x}>{y}"
    return {"p": float(points[key][0]), "ci": [float(cis[key][0, 0]), float(cis[key][1, 0])]}


def performance_profile_png(score_dict: Mapping[str, np.ndarray], path: str, *, title: str) -> None:
    """rliable's performance profile (fraction of runs above each normalised score tau)."""
    check_extra("matplotlib", extra="bench", what="python -m benchmarks.objectives")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import plot_utils

    taus = np.linspace(-0.25, 1.05, 66)
    profiles, cis = rly.create_performance_profile(dict(score_dict), taus, reps=500)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    # Distinct line styles: variants that tie draw on top of each other.
    styles = ["solid", "dashed", "dotted", "dashdot", (0, (5, 1, 1, 1, 1, 1))]
    plot_utils.plot_performance_profiles(
        profiles,
        taus,
        performance_profile_cis=cis,
        ax=ax,
        xlabel=r"normalised score $\tau$",
        linestyles={v: styles[i % len(styles)] for i, v in enumerate(score_dict)},
    )
    ax.set_title(title)
    ax.legend(loc="lower left")  # the profile lines carry their variant's label
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
