"""Evaluation: a policy (or a uniform-random baseline) plays full episodes to their natural end.

Termination or the env's own time limit (:data:`MAX_EPISODE_STEPS` where it sets none); no DPSA
unified truncation and no emulated scenario-load cost, so returns compare across policies and with the
literature. Two policies evaluated with one seed face the same episodes. Each episode is a
:class:`fastlight.rollout.EpisodeRecord` (with its reset ``seed``, ``task`` and, when asked, ``frames``).
Success and crashes follow :func:`~fastlight.rollout.success_after` and
:func:`~fastlight.rollout.crashed_at_end`. A policy acting in chunks of ``H`` env actions plays each
chunk open-loop; lengths, returns and the step index count env steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch

from fastlight.envs.registry import make_env
from fastlight.rollout import EpisodeRecord, crashed_at_end, success_after
from fastlight.sampling.obs import action_to_env, obs_to_tensor, stack_obs

#: ``(one observation, its step in the episode) -> env action``.
ActFn = Callable[[Any, int], Any]
#: ``(observation batch, step batch [B]) -> env actions [B, ...]`` (``[B, H, ...]`` for a policy
#: acting in chunks of ``H``): what :func:`play_episodes` calls.
BatchActFn = Callable[[Any, np.ndarray], Any]
#: Longest episode played when the env sets no time limit of its own; it ends ``truncated``.
MAX_EPISODE_STEPS = 10_000


def policy_act_fn(policy: torch.nn.Module, *, deterministic: bool = False) -> ActFn:
    """An :data:`ActFn` from a fastlight policy (one observation at a time)."""

    @torch.no_grad()
    def act(obs: Any, step: int) -> Any:
        batch = _to(obs_to_tensor(stack_obs([obs])), device_of(policy))
        out = policy.act(batch, step=torch.tensor([step]), deterministic=deterministic)
        return action_to_env(policy, out.actions)[0]

    return act


def policy_batch_act_fn(policy: torch.nn.Module, *, deterministic: bool = True) -> BatchActFn:
    """A :data:`BatchActFn` from a fastlight policy (``act`` then the policy's own ``env_action``)."""

    @torch.no_grad()
    def act(obs: Any, step: np.ndarray) -> np.ndarray:
        batch, steps = _to(obs_to_tensor(obs), device_of(policy)), torch.as_tensor(step, dtype=torch.long)
        out = policy.act(batch, step=steps, deterministic=deterministic)
        return policy.env_action(out.actions).detach().cpu().numpy()

    return act


def device_of(policy: torch.nn.Module) -> torch.device:
    """Where the policy computes (its first parameter's device; the CPU for one without parameters)."""
    return next((p.device for p in policy.parameters()), torch.device("cpu"))


def _to(obs: Any, device: torch.device) -> Any:
    """Observation tensors (a dict of them too) on ``device``: a policy trained on a GPU plays there."""
    if device.type == "cpu":
        return obs
    return {k: v.to(device) for k, v in obs.items()} if isinstance(obs, dict) else obs.to(device)


def random_act_fn(env: gym.Env, seed: int) -> ActFn:
    """Uniform-random actions from ``env``'s action space, seeded with ``seed``."""
    env.action_space.seed(seed)
    return lambda obs, step: env.action_space.sample()


def one_at_a_time(act: ActFn) -> BatchActFn:
    """A :data:`BatchActFn` that calls ``act`` on each observation of the batch in turn."""

    def act_batch(obs: Any, step: np.ndarray) -> list[Any]:
        one = (lambda j: {k: v[j] for k, v in obs.items()}) if isinstance(obs, dict) else (lambda j: obs[j])
        return [act(one(j), int(s)) for j, s in enumerate(step)]

    return act_batch


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play. ``task_id`` resets with ``options={"task_id": task_id}``; ``None`` resets
    without options and the record takes the reset info's ``task_id`` (0 if absent)."""

    seed: int
    task_id: int | None = None
    task: str | None = None
    record: bool = False


class EpisodeObserver(Protocol):
    """Reads the env's own state during :func:`play_episodes` (e.g. driving metrics from the simulator)."""

    def on_reset(self, env: gym.Env, episode: int) -> None:
        """Called after ``env.reset`` of episode ``episode`` (its index in the specs)."""

    def on_step(self, env: gym.Env, episode: int, done: bool) -> None:
        """Called after every ``env.step``; ``done`` on the episode's last step."""


def seeded_specs(episodes: int, seed: int, *, record: bool = False) -> list[EpisodeSpec]:
    """Episode ``i`` on seed ``seed + i``."""
    return [EpisodeSpec(seed + i, record=record) for i in range(episodes)]


def eval_seed(seed: int, task_id: int, episode: int) -> int:
    """Seed of evaluation episode ``episode`` of task ``task_id`` (a stream apart from demo seeds)."""
    return int(np.random.SeedSequence([seed, task_id, episode, 0xE7A1]).generate_state(1)[0])


def task_specs(
    task_names: Sequence[str], episodes_per_task: int, seed: int, *, record: int = 0
) -> list[EpisodeSpec]:
    """``episodes_per_task`` episodes of every task on :func:`eval_seed`; the first ``record`` keep frames."""
    return [
        EpisodeSpec(eval_seed(seed, k, i), task_id=k, task=name, record=i < record)
        for k, name in enumerate(task_names)
        for i in range(episodes_per_task)
    ]


def play_episodes(
    act: BatchActFn,
    envs: Sequence[gym.Env],
    specs: Sequence[EpisodeSpec],
    *,
    observer: EpisodeObserver | None = None,
    action_chunk: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[EpisodeRecord]:
    """Play every spec to its natural end, in order; one :class:`EpisodeRecord` per spec (the envs stay
    open). Consecutive specs of one task run ``len(envs)`` at a time in lockstep (one ``act`` call per
    step for the episodes still running). A kept frame is the observation's ``image`` or
    ``env.render()``. ``action_chunk``: ``act`` returns ``H`` env actions per episode (``[B, H, ...]``),
    played open-loop. ``progress(done, total)`` is called after each group."""
    if not envs:
        raise ValueError("play_episodes needs at least one env")
    if action_chunk is not None and action_chunk < 1:
        raise ValueError(f"play_episodes: action_chunk must be >= 1 or None, got {action_chunk}")
    records: list[EpisodeRecord] = []
    for group in _lockstep_groups(specs, len(envs)):
        records += _play_group(
            act, envs[: len(group)], group, observer, first=len(records), action_chunk=action_chunk
        )
        if progress is not None:
            progress(len(records), len(specs))
    return records


def _lockstep_groups(specs: Sequence[EpisodeSpec], size: int) -> Iterator[list[EpisodeSpec]]:
    group: list[EpisodeSpec] = []
    for spec in specs:
        if group and (len(group) == size or spec.task_id != group[0].task_id):
            yield group
            group = []
        group.append(spec)
    if group:
        yield group


def _play_group(
    act: BatchActFn,
    envs: Sequence[gym.Env],
    specs: list[EpisodeSpec],
    observer: EpisodeObserver | None,
    *,
    first: int,
    action_chunk: int | None = None,
) -> list[EpisodeRecord]:
    obs, eps = _start_group(envs, specs, observer, first=first)
    own_limit = [env.spec is not None and env.spec.max_episode_steps is not None for env in envs]
    live = list(range(len(envs)))
    while live:
        step = np.asarray([eps[i].length for i in live], dtype=np.int64)
        actions = act(stack_obs([obs[i] for i in live]), step)
        still = []
        for j, i in enumerate(live):
            chunk = [actions[j]] if action_chunk is None else actions[j][:action_chunk]
            if len(chunk) == 0:  # the episode would never advance
                raise ValueError(f"play_episodes: act returned an empty action chunk for episode {first + i}")
            for action in chunk:
                ep = eps[i]
                obs[i], reward, term, trunc, info = envs[i].step(action)
                ep.length += 1
                ep.ret += float(reward)
                ep.success = success_after(ep.success, info)
                capped = not own_limit[i] and ep.length >= MAX_EPISODE_STEPS  # counts as a time limit
                ep.terminated, ep.truncated = bool(term), bool(trunc) or capped
                _keep_frame(ep, specs[i], envs[i], obs[i])
                done = ep.terminated or ep.truncated
                if observer is not None:
                    observer.on_step(envs[i], first + i, done)
                if done:
                    ep.crashed = crashed_at_end(info)
                    break
            if not done:
                still.append(i)
        live = still
    return eps


def _start_group(
    envs: Sequence[gym.Env], specs: list[EpisodeSpec], observer: EpisodeObserver | None, *, first: int
) -> tuple[list[Any], list[EpisodeRecord]]:
    """Reset ``envs[j]`` for ``specs[j]``: the first observations and the empty records."""
    obs, eps = [], []
    for j, (env, spec) in enumerate(zip(envs, specs, strict=True)):
        options = None if spec.task_id is None else {"task_id": spec.task_id}
        o, info = env.reset(seed=spec.seed, options=options)
        task_id = spec.task_id if spec.task_id is not None else int(info.get("task_id", 0))
        obs.append(o)
        eps.append(EpisodeRecord(0, 0.0, False, False, task_id=task_id, seed=spec.seed, task=spec.task))
        _keep_frame(eps[j], spec, env, o)
        if observer is not None:
            observer.on_reset(env, first + j)
    return obs, eps


def _keep_frame(ep: EpisodeRecord, spec: EpisodeSpec, env: gym.Env, obs: Any) -> None:
    if not spec.record:
        return
    frame = obs["image"] if isinstance(obs, dict) and "image" in obs else env.render()
    if frame is not None:
        ep.frames.append(np.asarray(frame))


def run_episodes(
    env_id: str,
    act_fn: ActFn | None,
    *,
    episodes: int = 20,
    seed: int = 10_000,
    env_kwargs: dict[str, Any] | None = None,
    observer: EpisodeObserver | None = None,
    action_chunk: int | None = None,
) -> list[EpisodeRecord]:
    """Play ``episodes`` episodes of one env on seeds ``seed, seed+1, ...``; ``act_fn=None``: random.
    ``action_chunk``: ``act_fn`` returns that many env actions per call (:func:`play_episodes`)."""
    with contextlib.closing(make_env(env_id, env_kwargs=env_kwargs)) as env:
        act = act_fn or random_act_fn(env, seed)
        specs = seeded_specs(episodes, seed)
        return play_episodes(one_at_a_time(act), [env], specs, observer=observer, action_chunk=action_chunk)


def play_tasks(
    act: BatchActFn,
    *,
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    episodes_per_task: int = 20,
    seed: int = 12_345,
    batch: int = 4,
    record: int = 0,
    action_chunk: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    observer: EpisodeObserver | None = None,
) -> list[EpisodeRecord]:
    """Play ``episodes_per_task`` episodes of every task of a multi-task env (fastlight's Meta-World):
    :func:`task_specs` on ``min(batch, episodes_per_task)`` envs; the first ``record`` of each task keep
    their camera frames."""
    if episodes_per_task < 1 or batch < 1:
        raise ValueError(f"episodes_per_task and batch must be >= 1, got {episodes_per_task} and {batch}")
    envs = [make_env(env_id, env_kwargs=env_kwargs) for _ in range(min(batch, episodes_per_task))]
    try:
        specs = task_specs(tuple(envs[0].unwrapped.task_names), episodes_per_task, seed, record=record)
        return play_episodes(
            act, envs, specs, observer=observer, action_chunk=action_chunk, progress=progress
        )
    finally:
        for env in envs:
            env.close()


def play_policy(
    policy: torch.nn.Module,
    env_id: str,
    env_kwargs: dict[str, Any],
    *,
    episodes: int,
    seed: int,
    deterministic: bool = True,
    wrappers: Sequence[Mapping[str, Any]] = (),
    batch: int = 4,
    record: bool = False,
    task_names: tuple[str, ...] | None = None,
    progress: Callable[[int, int], None] | None = None,
    observer: EpisodeObserver | None = None,
) -> tuple[list[EpisodeRecord], tuple[str, ...], float]:
    """``(episodes, task names, the env's render fps)``: what ``fastlight evaluate`` and
    :class:`~fastlight.callbacks.periodic_evaluation.PeriodicEvaluation` play. On fastlight's
    multi-task Meta-World, ``episodes`` per task (:func:`play_tasks`); on any other env, episode ``i``
    on seed ``seed + i`` inside the run's gymnasium ``wrappers`` (fastlight's own :class:`EnvWrapper`
    settings left out). ``task_names``: :func:`probe_env`'s (``None``: probed here)."""
    from fastlight.envs.wrappers import EnvWrapper, wrap_env, wrapper_of
    from fastlight.models.action_mapping import action_chunk

    chunk = action_chunk(policy.action_mapping())  # chunks play open-loop, lengths in env steps
    if task_names is None:
        task_names, _ = probe_env(env_id, env_kwargs)
    if task_names:
        act = policy_batch_act_fn(policy, deterministic=deterministic)
        played = play_tasks(act, env_id=env_id, env_kwargs=env_kwargs, episodes_per_task=episodes, seed=seed,
                            batch=batch, record=episodes if record else 0, action_chunk=chunk,
                            progress=progress, observer=observer)  # fmt: skip
        return played, task_names, 20.0
    kwargs = {**env_kwargs, "render_mode": "rgb_array"} if record else env_kwargs
    gym_wrappers = [w for w in map(wrapper_of, wrappers) if not isinstance(w, EnvWrapper)]
    with contextlib.closing(wrap_env(make_env(env_id, env_kwargs=kwargs, flag="--env"), gym_wrappers)) as env:
        fps = float(min(max(env.metadata.get("render_fps") or 20, 1), 30))
        act = one_at_a_time(policy_act_fn(policy, deterministic=deterministic))
        specs = seeded_specs(episodes, seed, record=record)
        played = play_episodes(act, [env], specs, observer=observer, action_chunk=chunk, progress=progress)
        return played, (), fps


def summarise(episodes: list[EpisodeRecord], *, seed: int, n_boot: int = 10_000) -> dict[str, Any]:
    """Mean return (95% percentile-bootstrap CI over episodes), mean length, and the success and crash
    rates (95% Wilson CIs) where the env reports them on every episode (else ``None``)."""
    from fastlight.stats import stratified_mean_ci, wilson_interval

    returns = np.asarray([e.ret for e in episodes], dtype=np.float64)
    mean, low, high = stratified_mean_ci({"all": returns}, n_boot=n_boot, seed=seed)  # one stratum
    out: dict[str, Any] = {
        "episodes": len(episodes),
        "return": {"mean": mean, "ci_low": low, "ci_high": high, "std": float(returns.std())},
        "length": {"mean": float(np.mean([e.length for e in episodes]))},
        "return_ci": f"95% percentile bootstrap of the mean over episodes ({n_boot:,} resamples)",
    }
    for key, seen in (
        ("success_rate", [e.success for e in episodes if e.success is not None]),
        ("crash_rate", [e.crashed for e in episodes if e.crashed is not None]),
    ):
        if len(seen) < len(episodes):
            out[key] = None  # the env does not report it (on every episode)
            continue
        k = int(sum(seen))
        lo, hi = wilson_interval(k, len(seen))
        out[key] = {"rate": k / len(seen), "ci_low": lo, "ci_high": hi, "count": k}
    return out


def probe_env(env_id: str, env_kwargs: dict[str, Any]) -> tuple[tuple[str, ...], bool]:
    """``(task names, image mode)`` of the env, without stepping it; task names ``()`` for any env but
    fastlight's multi-task Meta-World."""
    from fastlight.envs.metaworld import MetaWorldEnv

    with contextlib.closing(make_env(env_id, env_kwargs=env_kwargs)) as env:
        base = env.unwrapped
        names = tuple(base.task_names) if isinstance(base, MetaWorldEnv) else ()
        space = env.observation_space
        return names, isinstance(space, gym.spaces.Dict) and "image" in space.spaces


def per_task_outcomes(episodes: list[EpisodeRecord], task_names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """task -> successes ``[n_task]`` (0/1 float, episode order), in the env's task order."""
    return {
        t: np.asarray([e.success is True for e in episodes if e.task == t], dtype=np.float64)
        for t in task_names
    }


def per_task_summary(
    episodes: list[EpisodeRecord], task_names: tuple[str, ...], *, n_boot: int, seed: int
) -> dict[str, Any]:
    """Per-task success with Wilson CIs, the stratified-bootstrap mean over tasks, mean length and return."""
    from fastlight.stats import stratified_mean_ci, wilson_interval

    outcomes = per_task_outcomes(episodes, task_names)
    per_task = {}
    for t, x in outcomes.items():
        k, n = int(x.sum()), int(x.size)
        low, high = wilson_interval(k, n)
        per_task[t] = {"successes": k, "episodes": n, "rate": k / n, "ci_low": low, "ci_high": high}
    mean, low, high = stratified_mean_ci(outcomes, n_boot=n_boot, seed=seed)
    return {
        "per_task": per_task,
        "mean": {"rate": mean, "ci_low": low, "ci_high": high},
        "mean_length": float(np.mean([e.length for e in episodes])),
        "mean_return": float(np.mean([e.ret for e in episodes])),
    }
