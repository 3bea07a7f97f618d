"""Scripted-expert demonstrations on Meta-World, cached on disk, for supervised fine-tuning.

VLA RL starts from a policy fine-tuned on demonstrations (AcceRL §experiments, SimpleVLA-RL, RLinf):
:class:`DemoDataModule` plays Meta-World's scripted expert of each task (``ENV_POLICY_MAP``, reading
``env.unwrapped.state``) in the *same* env the RL run samples from, so the observation is the one the
policy sees later. Demo attempt ``a`` of task ``k`` resets with ``options={"task_id": k}`` and a seed from
``SeedSequence([seed, k, a])``. The cache under ``cache_dir`` is keyed by every setting that changes it;
a cache file recording other settings is refused.

Batches are dicts: ``obs`` (the env's observation keys, ``[B, ...]``), ``actions [B, A]`` float
(clipped to the action space), ``step [B]`` and ``task_id [B]``. With action chunks of ``H``
(``action_chunk``), ``actions [B, H, A]`` are the expert's actions of steps ``t .. t+H-1`` and
``valid [B, H]`` is False (action 0) past the episode's end; one cache serves every ``H``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler
from typing_extensions import override

from fastlight.data.env_spec import EnvSizes, EnvSpec
from fastlight.data.protocols import RolloutPolicyModule, implements
from fastlight.envs.registry import make_env
from fastlight.models.action_mapping import action_chunk
from fastlight.rollout import success_after
from fastlight.safe_files import safe_load

#: Bump when the cached arrays change meaning.
CACHE_FORMAT = 1


@dataclass(frozen=True)
class DemoSettings:
    """Everything that changes the demonstrations (the cache key)."""

    env_id: str
    env_kwargs: dict[str, Any]
    demos_per_task: int
    seed: int
    successful_only: bool
    max_attempts_per_demo: int
    format: int = CACHE_FORMAT

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True, default=str).encode()).hexdigest()[:16]

    def as_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), sort_keys=True, default=str))


@dataclass
class Demos:
    """Transitions of the kept demonstrations, ``N`` in all (see the module docstring)."""

    obs: dict[str, Tensor]
    actions: Tensor  # [N, A] float32
    rewards: Tensor  # [N] float32
    step: Tensor  # [N] long
    task_id: Tensor  # [N] long
    episode: Tensor  # [N] long, 0..num_episodes-1
    task_names: tuple[str, ...]
    expert: dict[str, dict[str, int]] = field(default_factory=dict)  # task -> attempts, successes, kept

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    @property
    def num_episodes(self) -> int:
        return int(self.episode.max()) + 1 if len(self) else 0

    def summary(self) -> str:
        e = self.expert.values()
        attempts, successes, kept = (sum(v[k] for v in e) for k in ("attempts", "successes", "kept"))
        per_task = ", ".join(
            f"{t.removesuffix('-v3')} {v['successes']}/{v['attempts']}" for t, v in self.expert.items()
        )
        return (
            f"{kept} demonstrations ({len(self)} transitions) over {len(self.task_names)} tasks; "
            f"expert success {successes}/{attempts} = {successes / max(attempts, 1):.0%} ({per_task})"
        )


def expert_for(task_name: str) -> Any:
    """Meta-World's scripted expert of ``task_name`` (an object with ``get_action(state)``)."""
    from metaworld.policies import ENV_POLICY_MAP

    if task_name not in ENV_POLICY_MAP:
        raise ValueError(
            f"--data.env_kwargs.tasks: Meta-World has no scripted expert for {task_name!r}; "
            f"known: {sorted(ENV_POLICY_MAP)}"
        )
    return ENV_POLICY_MAP[task_name]()


def episode_seed(seed: int, task_id: int, attempt: int) -> int:
    """Seed of demo attempt ``attempt`` of task ``task_id`` (independent streams, no collisions)."""
    return int(np.random.SeedSequence([seed, task_id, attempt]).generate_state(1)[0])


def play_expert(
    env: Any, task_id: int, seed: int
) -> tuple[list[dict[str, np.ndarray]], list[np.ndarray], list[float], bool]:
    """One expert episode of task ``task_id`` in a (wrapped) :class:`~fastlight.envs.metaworld.MetaWorldEnv`:
    observations (before each action), actions, rewards, and whether it succeeded."""
    base = env.unwrapped
    expert = expert_for(base.task_names[task_id])
    low, high = env.action_space.low, env.action_space.high
    obs, info = env.reset(seed=seed, options={"task_id": task_id})
    observations, actions, rewards = [], [], []
    done, success = False, False
    while not done:
        action = np.clip(np.asarray(expert.get_action(base.state), dtype=np.float32), low, high)
        observations.append(obs)
        actions.append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(float(reward))
        success = bool(success_after(success, info))  # fastlight's one rule for success
        done = terminated or truncated
    return observations, actions, rewards, success


def generate_task(settings: DemoSettings, task_id: int) -> dict[str, Any]:
    """The kept demonstrations of one task, as numpy arrays (runs in a worker process)."""
    env = _demo_env(settings)
    wanted, budget = settings.demos_per_task, settings.demos_per_task * settings.max_attempts_per_demo
    obs: list[dict[str, np.ndarray]] = []
    actions, rewards, steps, episodes = [], [], [], []
    attempts = successes = kept = 0
    while kept < wanted and attempts < budget:
        o, a, r, ok = play_expert(env, task_id, episode_seed(settings.seed, task_id, attempts))
        attempts += 1
        successes += ok
        if ok or not settings.successful_only:
            obs += o
            actions += a
            rewards += r
            steps += range(len(a))
            episodes += [kept] * len(a)
            kept += 1
    env.close()
    stacked = {k: np.stack([x[k] for x in obs]) for k in obs[0]} if obs else {}
    return {
        "task_id": task_id,
        "obs": stacked,
        "actions": np.asarray(actions, dtype=np.float32),
        "rewards": np.asarray(rewards, dtype=np.float32),
        "step": np.asarray(steps, dtype=np.int64),
        "episode": np.asarray(episodes, dtype=np.int64),
        "expert": {"attempts": attempts, "successes": successes, "kept": kept},
    }


def _demo_env(settings: DemoSettings) -> Any:
    from fastlight.envs.metaworld import MetaWorldEnv

    env = make_env(settings.env_id, env_kwargs=settings.env_kwargs)
    if not isinstance(env.unwrapped, MetaWorldEnv):
        env.close()
        raise ValueError(
            f"--data.env_id: demonstrations come from Meta-World's scripted experts, so the env must be a "
            f"fastlight Meta-World env (fastlight/MetaWorld-v0, fastlight/MetaWorld-<task>), got "
            f"{settings.env_id!r}"
        )
    return env


def _init_worker(parent: int) -> None:
    from fastlight.procs import start_child

    start_child(parent, threads=1)


def generate(settings: DemoSettings, task_names: tuple[str, ...], num_workers: int) -> Demos:
    """Every task's demonstrations, ``num_workers`` spawned processes (0: in this process)."""
    ids = range(len(task_names))
    if num_workers == 0:
        parts = [generate_task(settings, k) for k in ids]
    else:
        workers, spawn = min(num_workers, len(task_names)), get_context("spawn")
        with ProcessPoolExecutor(workers, spawn, initializer=_init_worker, initargs=(os.getpid(),)) as pool:
            parts = list(pool.map(generate_task, [settings] * len(task_names), ids))
    return _concat(parts, task_names)


def _concat(parts: list[dict[str, Any]], task_names: tuple[str, ...]) -> Demos:
    parts = sorted(parts, key=lambda p: p["task_id"])
    empty = [task_names[p["task_id"]] for p in parts if p["expert"]["kept"] == 0]
    if empty:
        raise RuntimeError(
            f"the scripted expert kept no demonstration of {empty}: raise --data.max_attempts_per_demo "
            f"or set --data.successful_only false"
        )
    offsets = np.cumsum([0] + [p["expert"]["kept"] for p in parts[:-1]])  # episode numbers run on
    cat = lambda arrays: torch.from_numpy(np.concatenate(list(arrays)))  # noqa: E731
    return Demos(
        obs={k: cat(p["obs"][k] for p in parts) for k in parts[0]["obs"]},
        actions=cat(p["actions"] for p in parts),
        rewards=cat(p["rewards"] for p in parts),
        step=cat(p["step"] for p in parts),
        task_id=cat(np.full(len(p["actions"]), p["task_id"], dtype=np.int64) for p in parts),
        episode=cat(p["episode"] + o for p, o in zip(parts, offsets, strict=True)),
        task_names=task_names,
        expert={task_names[p["task_id"]]: p["expert"] for p in parts},
    )


# ---------------------------------------------------------------------- cache
def cache_path(cache_dir: str | Path, settings: DemoSettings) -> Path:
    return Path(cache_dir) / f"demos-{settings.key()}.pt"


def save_demos(path: Path, demos: Demos, settings: DemoSettings) -> None:
    """Write atomically (temporary file, then rename): a half-written cache is never picked up."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"settings": settings.as_json(), "demos": asdict(demos)}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    meta = {"settings": settings.as_json(), "expert": demos.expert, "transitions": len(demos)}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")


def load_demos(path: Path, settings: DemoSettings) -> Demos:
    """Load a cache file, refusing one recorded with other settings (never reused silently)."""
    payload = safe_load(path, flag=f"demo cache {path}")
    recorded = payload.get("settings") if isinstance(payload, dict) else None
    if recorded != settings.as_json():
        diff = (
            {k: (recorded.get(k), v) for k, v in settings.as_json().items() if recorded.get(k) != v}
            if isinstance(recorded, dict) else "no settings recorded"
        )  # fmt: skip
        raise ValueError(f"demo cache {path} was made with other settings (recorded, requested): {diff}")
    d = payload["demos"]
    d["task_names"] = tuple(d["task_names"])
    return Demos(**d)


# ---------------------------------------------------------------------- Lightning
class DemoDataset(Dataset):
    """Index with a list of transition indices -> one batch dict; ``chunk``: ``H`` consecutive expert
    actions per sample (``None``: one, ``actions [B, A]``)."""

    def __init__(self, demos: Demos, chunk: int | None = None) -> None:
        if chunk is not None and chunk < 1:
            raise ValueError(f"--data.action_chunk must be >= 1 or null, got {chunk}")
        self.demos = demos
        self.chunk = chunk

    def __len__(self) -> int:
        return len(self.demos)

    def __getitem__(self, idx: list[int]) -> dict[str, Any]:
        i = torch.as_tensor(idx, dtype=torch.long)
        d = self.demos
        batch = {
            "obs": {k: v[i] for k, v in d.obs.items()},
            "actions": d.actions[i],
            "step": d.step[i],
            "task_id": d.task_id[i],
        }
        if self.chunk is not None:
            batch["actions"], batch["valid"] = self._chunks(i)
        return batch

    def _chunks(self, i: Tensor) -> tuple[Tensor, Tensor]:
        """``(actions [B, H, A], valid [B, H])`` from each sample's step. Transitions are stored episode
        after episode, step after step, so step ``t + k`` of an episode sits at ``i + k``."""
        d, offsets = self.demos, torch.arange(self.chunk)
        j = i[:, None] + offsets  # [B, H]
        inside, j = j < len(d), j.clamp(max=len(d) - 1)
        same = (d.episode[j] == d.episode[i][:, None]) & (d.step[j] == d.step[i][:, None] + offsets)
        valid = inside & same
        actions = torch.where(valid[..., None], d.actions[j], d.actions.new_zeros(()))
        return actions, valid


class DemoDataModule(EnvSizes, L.LightningDataModule):
    """Scripted-expert demonstrations of the configured Meta-World tasks (see the module docstring).

    Args:
        env_id: the Meta-World env id, as the RL run's ``--data.env_id``.
        env_kwargs: the env's keyword arguments (tasks, image, ...), as the RL run's ``--data.env_kwargs``.
        demos_per_task: demonstrations kept per task.
        seed: base seed of the demo episodes.
        successful_only: keep only the episodes where the expert succeeded.
        max_attempts_per_demo: expert episodes tried per demo wanted, at most.
        num_workers: generating processes (0 = in the trainer process).
        batch_size: transitions per SFT batch.
        cache_dir: where generated demonstrations are kept, keyed by the settings above.
        action_chunk: expert actions per sample; ``None``: the trained module's policy's action chunk.
    """

    def __init__(
        self,
        env_id: str = "fastlight/MetaWorld-v0",
        env_kwargs: dict[str, Any] | None = None,
        demos_per_task: int = 30,
        seed: int = 0,
        successful_only: bool = True,
        max_attempts_per_demo: int = 5,
        num_workers: int = 2,
        batch_size: int = 256,
        cache_dir: str = "runs/demo_cache",
        action_chunk: int | None = None,
    ) -> None:
        super().__init__()
        for name, value, low in (
            ("demos_per_task", demos_per_task, 1), ("max_attempts_per_demo", max_attempts_per_demo, 1),
            ("num_workers", num_workers, 0), ("batch_size", batch_size, 1),
        ):  # fmt: skip
            if value < low:
                raise ValueError(f"--data.{name} must be >= {low}, got {value}")
        if action_chunk is not None and action_chunk < 1:
            raise ValueError(f"--data.action_chunk must be >= 1 or null (the policy's), got {action_chunk}")
        self.save_hyperparameters()
        self.settings = DemoSettings(
            env_id, dict(env_kwargs or {}), demos_per_task, seed, successful_only, max_attempts_per_demo
        )
        probe = _demo_env(self.settings)  # refuses unknown tasks and non-Meta-World envs now
        self.env_spec = EnvSpec.from_env(probe)
        self.task_names: tuple[str, ...] = tuple(probe.unwrapped.task_names)
        probe.close()
        for name in self.task_names:
            expert_for(name)
        self.demos: Demos | None = None

    @property
    def cache_file(self) -> Path:
        return cache_path(self.hparams.cache_dir, self.settings)

    @override
    def prepare_data(self) -> None:
        """Generate and cache the demonstrations unless a cache with these settings exists."""
        path = self.cache_file
        if path.exists():
            load_demos(path, self.settings)  # refuses a file recorded with other settings
            rank_zero_info(f"fastlight: demonstrations from cache {path}")
            return
        t0 = time.perf_counter()
        demos = generate(self.settings, self.task_names, self.hparams.num_workers)
        save_demos(path, demos, self.settings)
        dt = time.perf_counter() - t0
        rank_zero_info(f"fastlight: generated {demos.summary()} in {dt:.0f} s -> {path}")

    @override
    def setup(self, stage: str) -> None:
        if self.demos is None:
            self.demos = load_demos(self.cache_file, self.settings)
            rank_zero_info(f"fastlight: {self.demos.summary()}")

    def load(self) -> Demos:
        """Generate (or read the cache) and return the demonstrations, outside a Trainer."""
        self.prepare_data()
        self.setup("fit")
        assert self.demos is not None
        return self.demos

    def action_chunk(self) -> int | None:
        """``--data.action_chunk``, else the trained module's policy's (``None``: no chunks or no trainer)."""
        if self.hparams.get("action_chunk") is not None:
            return int(self.hparams.action_chunk)
        module = self.trainer.lightning_module if self.trainer is not None else None
        if implements(module, RolloutPolicyModule):
            return action_chunk(module.policy.action_mapping())
        return None

    @override
    def train_dataloader(self) -> DataLoader:
        if self.demos is None:
            raise RuntimeError("DemoDataModule.train_dataloader before setup()")
        ds = DemoDataset(self.demos, self.action_chunk())
        sampler = BatchSampler(RandomSampler(ds), self.hparams.batch_size, drop_last=False)
        return DataLoader(ds, sampler=sampler, batch_size=None, num_workers=0)
