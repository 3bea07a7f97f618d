"""The run grid of the objectives study: variants x envs x lags x seeds, its fingerprint, shards.

A grid is fully described by its :class:`GridConfig`; its fingerprint is a hash of that config
(every setting that changes a run's result), so shards of one grid, run on different machines,
can be merged and shards of two different grids cannot.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from fastlight.modules.objectives import GIPO, SAPO, PPOClip

#: The study's variants (AcceRL §GIPO, Table 9: PPO clip 0.2, SAPO tau 1.0 / 1.05, GIPO sigma in
#: {0.2, 0.5, 1.0}). Any ``gipo<sigma>`` with sigma > 0 is accepted too (see :func:`variant_settings`).
VARIANTS = ("ppo", "sapo", "gipo0.2", "gipo0.5", "gipo1.0")


def variant_settings(name: str) -> dict[str, Any]:
    """RLModule arguments of a variant: ``ppo``, ``sapo`` or ``gipo<sigma>`` (e.g. ``gipo0.2``).

    The objective is written as its config (``class_path`` / ``init_args``, JSON like the grid),
    which ``RLModule`` takes as well as the object. An unknown name or a sigma <= 0 raises one line
    naming ``--variants``.
    """
    if name == "ppo":
        return {"objective": PPOClip(clip_eps=0.2).config()}
    if name == "sapo":
        return {"objective": SAPO(tau_pos=1.0, tau_neg=1.05).config()}
    if name.startswith("gipo"):
        try:
            sigma = float(name[4:])
        except ValueError:
            sigma = None
        if sigma is not None and sigma > 0:
            return {"objective": GIPO(sigma=sigma).config()}
        if sigma is not None:
            raise ValueError(
                f"--variants: GIPO's sigma must be > 0 (gipo<sigma>, e.g. gipo0.2), got {name!r}"
            )
    raise ValueError(
        f"--variants must be ppo, sapo or gipo<sigma> (default {' '.join(VARIANTS)}), got {name!r}"
    )


#: gymnasium's MuJoCo v5 tasks, AcceRL's 10 (continuous actions).
MUJOCO_ENVS = (
    "Ant-v5",
    "HalfCheetah-v5",
    "Hopper-v5",
    "Humanoid-v5",
    "InvertedPendulum-v5",
    "InvertedDoublePendulum-v5",
    "Pusher-v5",
    "Reacher-v5",
    "Swimmer-v5",
    "Walker2d-v5",
)

#: ``--quick``: the three cheapest tasks per env step that still learn within a short budget.
QUICK_ENVS = ("InvertedPendulum-v5", "InvertedDoublePendulum-v5", "Hopper-v5")


@dataclass(frozen=True)
class GridConfig:
    """Every setting that shapes the runs; hashed into the grid fingerprint.

    ``budget`` is env steps per run, the valid transitions the learner trains on (each update
    consumes ``num_envs x rollout_steps`` of them, so a run is ``budget // that`` updates).
    """

    envs: tuple[str, ...]
    variants: tuple[str, ...]
    lags: tuple[int, ...]
    seeds: tuple[int, ...]
    budget: int
    num_envs: int = 16
    rollout_steps: int = 32
    update_epochs: int = 4
    num_minibatches: int = 4
    lr: float = 3e-4
    last_k: int = 10
    # Per-variant objective settings, so that changing a variant's sigma changes the fingerprint.
    variant_settings: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.variant_settings:
            object.__setattr__(self, "variant_settings", {v: variant_settings(v) for v in self.variants})

    @property
    def steps_per_update(self) -> int:
        return self.num_envs * self.rollout_steps

    @property
    def updates(self) -> int:
        return max(1, self.budget // self.steps_per_update)

    def fingerprint(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_json(self) -> dict:
        return {**asdict(self), "fingerprint": self.fingerprint()}

    @staticmethod
    def from_json(data: dict) -> GridConfig:
        data = {k: v for k, v in data.items() if k != "fingerprint"}
        for key in ("envs", "variants", "lags", "seeds"):
            data[key] = tuple(data[key])
        return GridConfig(**data)


@dataclass(frozen=True)
class RunSpec:
    """One run: a variant on an env at a lag with a seed."""

    env: str
    variant: str
    lag: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.env}__{self.variant}__lag{self.lag}__seed{self.seed}"


def grid_runs(grid: GridConfig) -> list[RunSpec]:
    """Every run of the grid in a fixed order (env, lag, seed, variant): a shard of a few runs
    still holds every variant of a cell, so partial results compare like with like."""
    return [
        RunSpec(env, variant, lag, seed)
        for env in grid.envs
        for lag in grid.lags
        for seed in grid.seeds
        for variant in grid.variants
    ]


def shard_runs(runs: list[RunSpec], index: int, count: int) -> list[RunSpec]:
    """Shard ``index`` of ``count`` (0-based): runs ``index, index + count, ...``, so that every
    shard gets a mix of envs (equal cost) and together they cover the grid exactly once."""
    return runs[index::count]


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` with ``0 <= i < n``; a bad value raises one line naming ``--shard``."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard must be i/n with integers 0 <= i < n (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard must be i/n with integers 0 <= i < n (e.g. 0/4), got {text!r}")
    return i, n


def check_grid(
    *, envs: list[str], variants: list[str], lags: list[int], seeds: list[int], budget: int
) -> None:
    """Refuse unknown variants or envs, negative lags, empty lists; each error names its flag."""
    for v in variants:
        variant_settings(v)
    bad_envs = [e for e in envs if e not in MUJOCO_ENVS]
    if bad_envs:
        raise ValueError(
            f"--envs must be among the MuJoCo v5 tasks {' | '.join(MUJOCO_ENVS)}, got {bad_envs}"
        )
    if not envs or not variants or not lags or not seeds:
        raise ValueError("--envs, --variants, --lags and --seeds must each name at least one value")
    if any(lag < 0 for lag in lags):
        raise ValueError(f"--lags must be >= 0 (max_staleness), got {lags}")
    if budget < 1:
        raise ValueError(f"--budget must be >= 1 env step, got {budget}")
