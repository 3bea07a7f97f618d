"""Evaluation episodes for a trained policy (or a uniform-random baseline).

Episodes run to their natural end (termination or the env's own time limit): no DPSA
truncation here, so returns are comparable across policies and with the literature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch

from fastlight.envs.registry import make_env
from fastlight.rollout import EpisodeRecord
from fastlight.sampling.obs import action_to_env, obs_to_tensor

ActFn = Callable[[Any, int], Any]


def policy_act_fn(policy: torch.nn.Module, *, deterministic: bool = False) -> ActFn:
    """An ``(obs, step) -> env action`` function from a fastlight policy."""

    @torch.no_grad()
    def act(obs: Any, step: int) -> Any:
        batch = obs_to_tensor(
            np.asarray(obs)[None]
            if not isinstance(obs, dict)
            else {k: np.asarray(v)[None] for k, v in obs.items()}
        )
        out = policy.act(batch, step=torch.tensor([step]), deterministic=deterministic)
        return action_to_env(policy, out.actions)[0]

    return act


def random_act_fn(env: gym.Env, seed: int) -> ActFn:
    env.action_space.seed(seed)
    return lambda obs, step: env.action_space.sample()


class EpisodeObserver(Protocol):
    """Reads the env's own state during :func:`run_episodes` (e.g. driving metrics from the simulator)."""

    def on_reset(self, env: gym.Env, episode: int) -> None:
        """Called after ``env.reset`` of episode ``episode``."""

    def on_step(self, env: gym.Env, episode: int, done: bool) -> None:
        """Called after every ``env.step``; ``done`` on the episode's last step."""


def run_episodes(
    env_id: str,
    act_fn: ActFn | None,
    *,
    episodes: int = 20,
    seed: int = 10_000,
    env_kwargs: dict[str, Any] | None = None,
    observer: EpisodeObserver | None = None,
) -> list[EpisodeRecord]:
    """Play ``episodes`` episodes with seeds ``seed, seed+1, ...``; ``act_fn=None`` acts at random.

    ``observer`` sees the env after each reset and each step (episodes end naturally: no DPSA cut).
    """
    env = make_env(env_id, env_kwargs=env_kwargs)
    act = act_fn or random_act_fn(env, seed)
    records = []
    for i in range(episodes):
        obs, info = env.reset(seed=seed + i)
        if observer is not None:
            observer.on_reset(env, i)
        ret, steps, done = 0.0, 0, False
        while not done:
            obs, reward, term, trunc, info = env.step(act(obs, steps))
            ret += float(reward)
            steps += 1
            done = term or trunc
            if observer is not None:
                observer.on_step(env, i, bool(done))
        records.append(
            EpisodeRecord(
                length=steps,
                ret=ret,
                terminated=bool(term),
                truncated=bool(trunc),
                crashed=bool(info.get("crashed", False)),
                success=bool(info.get("success", False)),
            )
        )
    env.close()
    return records


# ---------------------------------------------------------------------- multi-task evaluation
#: ``(obs batch, step batch [B]) -> env actions [B, A]``: a batched policy for :func:`play_tasks`.
BatchActFn = Callable[[dict[str, np.ndarray], np.ndarray], np.ndarray]


@dataclass
class TaskEpisode:
    """One evaluation episode of one task, played to its natural end (success or time limit)."""

    task: str
    task_id: int
    seed: int
    success: bool
    length: int
    ret: float
    frames: list[np.ndarray] = field(default_factory=list, repr=False)  # uint8 [S, S, 3], if recorded


def eval_seed(seed: int, task_id: int, episode: int) -> int:
    """Seed of evaluation episode ``episode`` of task ``task_id`` (a stream apart from demo seeds)."""
    return int(np.random.SeedSequence([seed, task_id, episode, 0xE7A1]).generate_state(1)[0])


def policy_batch_act_fn(policy: torch.nn.Module, *, deterministic: bool = True) -> BatchActFn:
    """A :data:`BatchActFn` from a fastlight policy (``act`` then the policy's own ``env_action``)."""

    @torch.no_grad()
    def act(obs: dict[str, np.ndarray], step: np.ndarray) -> np.ndarray:
        out = policy.act(
            obs_to_tensor(obs), step=torch.as_tensor(step, dtype=torch.long), deterministic=deterministic
        )
        return policy.env_action(out.actions).detach().cpu().numpy()

    return act


def play_tasks(
    act: BatchActFn,
    *,
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    episodes_per_task: int = 20,
    seed: int = 12_345,
    batch: int = 4,
    record: int = 0,
) -> list[TaskEpisode]:
    """Play ``episodes_per_task`` episodes of every task of a multi-task env (fastlight's Meta-World).

    Episodes of one task run ``batch`` at a time in lockstep (one batched policy call per step);
    episode ``i`` of task ``k`` is reset with ``options={"task_id": k}`` and :func:`eval_seed`, so
    two policies evaluated with the same ``seed`` face the same goals. No DPSA cut: an episode ends
    on success or at the env's time limit. The first ``record`` episodes of each task keep their
    camera frames (image mode only).
    """
    if episodes_per_task < 1 or batch < 1:
        raise ValueError(f"episodes_per_task and batch must be >= 1, got {episodes_per_task} and {batch}")
    envs = [make_env(env_id, env_kwargs=env_kwargs) for _ in range(min(batch, episodes_per_task))]
    names = tuple(envs[0].unwrapped.task_names)
    results: list[TaskEpisode] = []
    try:
        for k, name in enumerate(names):
            for start in range(0, episodes_per_task, len(envs)):
                ids = list(range(start, min(start + len(envs), episodes_per_task)))
                results += _play_lockstep(
                    act,
                    envs[: len(ids)],
                    name,
                    k,
                    [eval_seed(seed, k, i) for i in ids],
                    [i < record for i in ids],
                )
    finally:
        for env in envs:
            env.close()
    return results


def _play_lockstep(
    act: BatchActFn, envs: list[gym.Env], name: str, task_id: int, seeds: list[int], record: list[bool]
) -> list[TaskEpisode]:
    obs = [env.reset(seed=s, options={"task_id": task_id})[0] for env, s in zip(envs, seeds, strict=True)]
    eps = [TaskEpisode(name, task_id, s, False, 0, 0.0) for s in seeds]
    live = list(range(len(envs)))
    while live:
        batch = {key: np.stack([obs[i][key] for i in live]) for key in obs[live[0]]}
        actions = act(batch, np.asarray([eps[i].length for i in live], dtype=np.int64))
        still = []
        for j, i in enumerate(live):
            if record[i] and "image" in obs[i]:
                eps[i].frames.append(obs[i]["image"])
            obs[i], reward, term, trunc, info = envs[i].step(actions[j])
            eps[i].length += 1
            eps[i].ret += float(reward)
            eps[i].success = eps[i].success or bool(info.get("success", False))
            if not (term or trunc):
                still.append(i)
        live = still
    return eps
