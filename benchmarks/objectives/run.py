"""One run of the objectives study, through fastlight's own trainer path, and its baselines.

    python -m benchmarks.objectives.run --grid grid.json --run HalfCheetah-v5__ppo__lag1__seed0 \
        --out results/

A run is ``RolloutDataModule`` (one sampler process, ``autoreset`` envs, ``max_staleness`` = the
lag) + ``RLModule`` (the variant's objective) + a Lightning ``Trainer`` for ``budget // (num_envs x
rollout_steps)`` updates (the data module has no env-step budget: the update count is derived
from the fixed rollout size). Each run is its own process (``objectives.py`` starts it), so runs
share no state and a crash costs one run. The result JSON is written last: a file that exists is
a finished run, which is how a re-started shard resumes.

Also here: the random policy's score per env (the normalisation's floor, cached) and a plain
gymnasium loop's env steps/s (the physical ceiling the run's throughput is compared against).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import gymnasium as gym
import lightning as L
import numpy as np

from benchmarks.objectives.curve import LearningCurve
from benchmarks.objectives.grid import GridConfig, RunSpec, grid_runs
from fastlight.data.datamodule import RolloutDataModule
from fastlight.evaluation import run_episodes
from fastlight.modules.rl_module import RLModule

#: Random-policy episodes per env for the normalisation floor.
RANDOM_EPISODES = 20


def run_one(grid: GridConfig, spec: RunSpec) -> dict:
    """Train one variant on one env at one lag; returns the result record."""
    L.seed_everything(spec.seed, workers=True, verbose=False)
    data = RolloutDataModule(
        env_id=spec.env,
        num_envs=grid.num_envs,
        num_workers=1,
        reset_mode="autoreset",
        rollout_steps=grid.rollout_steps,
        max_staleness=spec.lag,
        steps_per_epoch=grid.updates,
        seed=1000 * spec.seed,
    )
    module = RLModule(
        obs_dim=data.obs_dim,
        action_dim=data.action_dim,
        continuous=data.continuous,
        lr=grid.lr,
        update_epochs=grid.update_epochs,
        num_minibatches=grid.num_minibatches,
        # CleanRL's MuJoCo PPO settings: no entropy bonus, gamma 0.99, lambda 0.95, grad clip 0.5.
        ent_coef=0.0,
        **grid.variant_settings[spec.variant],
    )
    curve = LearningCurve()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        callbacks=[curve],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    t0 = time.perf_counter()
    trainer.fit(module, datamodule=data)
    return {
        "run": spec.name,
        **spec.__dict__,
        "score": curve.score(grid.last_k),
        "env_steps": curve.env_steps,
        "updates": int(module.policy_version),
        "curve": curve.points,
        "mean_lag": curve.mean_lag,
        "max_lag": curve.lag_max,
        "dropped_stale": int(data.dropped_stale),
        "sampler_tps": curve.sampler_tps,
        "end_to_end_tps": curve.end_to_end_tps,
        "fit_s": time.perf_counter() - t0,
    }


def random_score(env_id: str, cache: str) -> float:
    """Mean return of a uniform-random policy over :data:`RANDOM_EPISODES` seeded episodes,
    cached in the JSON file ``cache`` (one entry per env)."""
    scores = _read_json(cache)
    if env_id not in scores:
        episodes = run_episodes(env_id, None, episodes=RANDOM_EPISODES, seed=10_000)
        scores[env_id] = float(np.mean([e.ret for e in episodes]))
        _write_json(cache, scores)
    return scores[env_id]


def plain_loop_tps(env_id: str, steps: int = 5000, seed: int = 0) -> float:
    """Env steps/s of a bare gymnasium loop with random actions: the physical ceiling."""
    env = gym.make(env_id)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    dt = plain_steps_s(env, steps)
    env.close()
    return steps / dt


def plain_steps_s(env: gym.Env, steps: int) -> float:
    """Seconds of ``steps`` random-action steps of an already reset ``env``, resetting at episode ends."""
    t0 = time.perf_counter()
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    return time.perf_counter() - t0


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _write_json(path: str, data: dict) -> None:
    """Write through a temporary file, so a reader never sees half a result."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", required=True, help="the grid's JSON (written by benchmarks.objectives)")
    p.add_argument("--run", required=True, help="a run name of that grid")
    p.add_argument("--out", required=True, help="the shard's run folder")
    args = p.parse_args(argv)
    grid = GridConfig.from_json(_read_json(args.grid))
    specs = {s.name: s for s in grid_runs(grid)}
    if args.run not in specs:
        p.error(f"--run {args.run!r} is not a run of the grid {args.grid}")
    spec = specs[args.run]
    result = run_one(grid, spec)
    result["plain_loop_tps"] = plain_loop_tps(spec.env)
    _write_json(os.path.join(args.out, f"{spec.name}.json"), result)


if __name__ == "__main__":
    main()
