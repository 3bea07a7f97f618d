"""The Stable-Baselines3 peer of the convergence benchmark, one training run in its own process:
``python -m benchmarks.convergence.sb3 <run.json>``.

SB3's PPO with highway-env's own recipe (``scripts/sb3_highway_ppo.py``: an MLP of 256 x 256 for the
actor and for the critic, ``n_epochs=10``, ``learning_rate=5e-4``, ``gamma=0.8``, ``batch_size=64``) on
the same env as fastlight's runs, with the same emulated scenario load on every reset
(:class:`~fastlight.envs.scenario_cost.ScenarioLoadCost`, exactly as fastlight's samplers wrap their
envs), in a ``SubprocVecEnv`` of as many envs as fastlight's clips, for the same training wall-clock.

``n_steps`` (per env and update) is ``ceil(valid_steps_per_update / num_envs)``, the same rounding as
fastlight's ``autoreset`` mode, so one SB3 update sees about as many transitions as one of fastlight's
(every SB3 transition is valid: SB3 auto-resets each env on its own).

``SubprocVecEnv`` runs one process per env and cannot put several envs in one process, so the peer
keeps fastlight's env count (10 clips -> 10 env processes, time-sharing the cores) rather than
dropping to one env per core: the per-update data then has the same number of independent episodes,
and the emulated loads of the 10 envs overlap (they sleep in separate processes) as they do on
fastlight's reset thread pool.

:class:`Sb3WallClockSnapshots` mirrors :class:`~benchmarks.convergence.snapshots.WallClockSnapshots`:
the clock starts when the first rollout reaches the update (process start-up, imports and the env
processes' first resets excluded), snapshot time is excluded, and the run stops after the first
update at or past the budget.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO as Sb3PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import SubprocVecEnv
from typing_extensions import override

from fastlight.envs.registry import make_env
from fastlight.envs.scenario_cost import ScenarioLoadCost
from fastlight.evaluation import ActFn, run_episodes

LABEL = "sb3-ppo"

#: highway-env's SB3 PPO recipe (``n_steps`` is sized per run, see :attr:`Sb3RunConfig.n_steps`).
SB3_PPO: dict[str, Any] = {
    "policy_kwargs": {"net_arch": {"pi": [256, 256], "vf": [256, 256]}},
    "n_epochs": 10,
    "learning_rate": 5.0e-4,
    "gamma": 0.8,
    "batch_size": 64,
}


@dataclass
class Sb3RunConfig:
    """Everything one SB3 run needs (JSON on the command line of this module)."""

    env_id: str
    num_envs: int
    seed: int
    budget_s: float
    every_s: float
    valid_steps_per_update: int
    scenario_load_cost_s: float
    folder: str
    model: dict[str, Any] = field(default_factory=lambda: json.loads(json.dumps(SB3_PPO)))

    @property
    def label(self) -> str:
        return LABEL

    @property
    def n_steps(self) -> int:
        """Steps per env and update: ``num_envs * n_steps`` ~ ``valid_steps_per_update``."""
        n = math.ceil(self.valid_steps_per_update / self.num_envs)
        # SB3 normalises advantages per minibatch: a last minibatch of one transition would be NaN.
        if (n * self.num_envs) % int(self.model["batch_size"]) == 1:
            n += 1
        return n


class EnvFactory:
    """A picklable ``() -> env`` for ``SubprocVecEnv``: ``make_env`` + ``ScenarioLoadCost`` when set
    (what :meth:`fastlight.sampling.bundle.SamplerConfig.build_envs` builds for fastlight's samplers)."""

    def __init__(self, env_id: str, scenario_load_cost_s: float) -> None:
        self.env_id = env_id
        self.scenario_load_cost_s = scenario_load_cost_s

    def __call__(self) -> gym.Env:
        env = make_env(self.env_id, flag="--env")
        if self.scenario_load_cost_s > 0:
            env = ScenarioLoadCost(seconds=self.scenario_load_cost_s).wrap(env)
        return env


class Sb3WallClockSnapshots(BaseCallback):
    """Saves ``snap_<k>.zip`` (``model.save``) + ``snap_<k>.json`` (``{t, updates, valid_steps}``) into
    ``folder`` at t = 0, every ``every_s`` of training time, and at the stop (after ``budget_s``)."""

    def __init__(self, folder: str | Path, *, every_s: float, budget_s: float) -> None:
        super().__init__(verbose=0)
        if not 0 < every_s <= budget_s:
            raise ValueError(
                f"Sb3WallClockSnapshots needs 0 < every_s <= budget_s, got {every_s}, {budget_s}"
            )
        self.folder = Path(folder)
        self.every_s = every_s
        self.budget_s = budget_s
        self.updates = 0
        self.valid_steps = 0
        self.snapshots = 0
        self.elapsed = 0.0
        self._t0: float | None = None
        self._excluded = 0.0
        self._stop = False

    def _save(self) -> None:
        t = time.perf_counter()
        self.model.save(self.folder / f"snap_{self.snapshots:04d}.zip")
        meta = {"t": self.elapsed, "updates": self.updates, "valid_steps": self.valid_steps}
        (self.folder / f"snap_{self.snapshots:04d}.json").write_text(json.dumps(meta))
        self.snapshots += 1
        self._excluded += time.perf_counter() - t

    @override
    def _on_rollout_end(self) -> None:
        if self._t0 is None:  # the first rollout has reached the update: the clock starts
            self._t0 = time.perf_counter()
            self._save()  # t = 0: the initial policy

    @override
    def _on_rollout_start(self) -> None:
        if self._t0 is None:  # before the first rollout: nothing trained yet
            return
        # SB3 calls this right after ``train()``: one update is done.
        self.updates += 1
        self.valid_steps += self.model.n_steps * self.model.n_envs
        self.elapsed = time.perf_counter() - self._t0 - self._excluded
        if self.elapsed >= self.budget_s:
            self._save()
            self._stop = True  # SB3 stops the run at the next ``_on_step`` that returns False
        elif self.elapsed >= self.snapshots * self.every_s:
            self._save()

    @override
    def _on_step(self) -> bool:
        return not self._stop


def train(cfg: Sb3RunConfig) -> dict[str, Any]:
    torch.set_num_threads(1)  # the env processes need the cores (as fastlight's runs do)
    folder = Path(cfg.folder)
    folder.mkdir(parents=True, exist_ok=True)
    venv = SubprocVecEnv([EnvFactory(cfg.env_id, cfg.scenario_load_cost_s) for _ in range(cfg.num_envs)])
    try:
        model = Sb3PPO(
            "MlpPolicy", venv, n_steps=cfg.n_steps, seed=cfg.seed, device="cpu", verbose=0, **cfg.model
        )
        snaps = Sb3WallClockSnapshots(folder, every_s=cfg.every_s, budget_s=cfg.budget_s)
        t0 = time.perf_counter()
        model.learn(total_timesteps=10**15, callback=snaps)  # stopped by the callback's budget
        fit_s = time.perf_counter() - t0
    finally:
        venv.close()
    summary = {
        **asdict(cfg),
        "label": cfg.label,
        "n_steps": cfg.n_steps,
        "updates": snaps.updates,
        "valid_steps": snaps.valid_steps,
        "train_s": snaps.elapsed,
        "fit_s": fit_s,
        "snapshots": snaps.snapshots,
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


# ---------------------------------------------------------------------- evaluation
def sb3_act_fn(model: Sb3PPO, *, deterministic: bool = False) -> ActFn:
    """An ``(obs, step) -> env action`` function (:data:`fastlight.evaluation.ActFn`) from an SB3 model.

    Sampled actions (``deterministic=False``) draw from torch's global generator, so a caller that
    reseeds torch gets the same actions again.
    """
    discrete = isinstance(model.action_space, gym.spaces.Discrete)

    def act(obs: Any, step: int) -> Any:
        action, _ = model.predict(obs, deterministic=deterministic)
        return int(action) if discrete else np.asarray(action)

    return act


def evaluate_sb3_run(
    summary: dict[str, Any], *, episodes: int, seed: int, greedy: bool = False
) -> list[dict[str, float]]:
    """Every snapshot of an SB3 run on the evaluation seeds, as
    :func:`benchmarks.convergence.evaluate_run` does for fastlight's runs (torch reseeded per
    snapshot, episodes to their natural end, native resets)."""
    curve = []
    for path in sorted(Path(summary["folder"]).glob("snap_*.zip")):
        meta = json.loads(path.with_suffix(".json").read_text())
        model = Sb3PPO.load(path, device="cpu")
        torch.manual_seed(seed)
        eps = run_episodes(
            summary["env_id"], sb3_act_fn(model, deterministic=greedy), episodes=episodes, seed=seed
        )
        curve.append(
            {
                "t": float(meta["t"]),
                "updates": int(meta["updates"]),
                "valid_steps": int(meta["valid_steps"]),
                "return": float(np.mean([e.ret for e in eps])),
                "length": float(np.mean([e.length for e in eps])),
            }
        )
    return curve


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cfg = Sb3RunConfig(**json.loads(Path(argv[0]).read_text()))
    train(cfg)


if __name__ == "__main__":
    main()
