"""Plain-MLP behaviour cloning on Meta-World scripted-expert demonstrations: the VLA's first peer.

    python -m benchmarks.vla.bc_baseline --config configs/vla_metaworld_mt10_sft.yaml \\
        --demos-per-task 30 --time 240 --out runs/bc_mlp/mlp30.pt --eval-episodes 10

The baseline a user would try before a VLA: an MLP (256x256, ReLU, tanh output) regressing the
expert's action with MSE from ``proprio`` concatenated with a one-hot of the task. It trains on the
*same* demonstrations as the VLA's SFT stage: the env id / kwargs, demo seed and cache directory
come from the config's ``data.init_args`` (``DemoDataModule``), so an existing cache is reused.

The task id is not part of the observation; the policy recovers it at play time from
``instruction_ids`` through a lookup built from the demonstrations (each task's instruction row ->
its task index). An instruction never seen in the demonstrations is an error, not a guess.

Proprio is standardised with the demonstrations' mean / std (stored with the weights), since
Meta-World's state mixes positions in metres with gripper and quaternion entries of other scales.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fastlight.evaluation import BatchActFn
from fastlight.vla.demos import Demos

#: Bump when the saved dict changes meaning.
SAVE_FORMAT = 1
#: Steps averaged for the reported final (and initial) training loss.
LOSS_WINDOW = 100

InstructionLookup = dict[tuple[int, ...], int]


class MLPBehaviourCloning(nn.Module):
    """MLP policy ``(proprio, task one-hot) -> action`` in ``[-1, 1]`` (tanh output).

    Args:
        proprio_dim: ``P``, size of the ``proprio`` observation.
        num_tasks: ``K``, size of the task one-hot.
        action_dim: ``A``.
        hidden: widths of the ReLU hidden layers.
        proprio_mean, proprio_std: ``[P]`` standardisation of ``proprio`` (default: identity);
            kept as buffers so they travel in the ``state_dict``.
    """

    def __init__(
        self,
        proprio_dim: int,
        num_tasks: int,
        action_dim: int,
        hidden: tuple[int, ...] = (256, 256),
        proprio_mean: Tensor | None = None,
        proprio_std: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.proprio_dim, self.num_tasks, self.action_dim = proprio_dim, num_tasks, action_dim
        self.hidden = tuple(int(h) for h in hidden)
        mean = torch.zeros(proprio_dim) if proprio_mean is None else proprio_mean.detach().float().clone()
        std = torch.ones(proprio_dim) if proprio_std is None else proprio_std.detach().float().clone()
        if mean.shape != (proprio_dim,) or std.shape != (proprio_dim,):
            raise ValueError(
                f"proprio_mean/std must have shape [{proprio_dim}], got {mean.shape} / {std.shape}"
            )
        self.register_buffer("proprio_mean", mean)
        self.register_buffer("proprio_std", std)
        layers: list[nn.Module] = []
        width = proprio_dim + num_tasks
        for h in self.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, action_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, proprio: Tensor, task_id: Tensor) -> Tensor:
        """``proprio [B, P]`` float, ``task_id [B]`` long in ``[0, K)`` -> actions ``[B, A]`` in [-1, 1]."""
        x = (proprio.float() - self.proprio_mean) / self.proprio_std
        onehot = F.one_hot(task_id.long(), self.num_tasks).to(x.dtype)
        return torch.tanh(self.net(torch.cat([x, onehot], dim=-1)))


# ---------------------------------------------------------------------- task id from the instruction
def instruction_lookup(demos: Demos) -> InstructionLookup:
    """Map each instruction-id row seen in ``demos`` (``obs["instruction_ids"] [N, L]``) to its task index.

    A row shared by two tasks would make the task ambiguous at play time, so it is refused.
    """
    if "instruction_ids" not in demos.obs:
        raise ValueError(
            f"the demonstrations have no 'instruction_ids' observation (keys: {sorted(demos.obs)})"
        )
    rows, inverse = torch.unique(demos.obs["instruction_ids"].long(), dim=0, return_inverse=True)
    lookup: InstructionLookup = {}
    for r, row in enumerate(rows.tolist()):
        tasks = torch.unique(demos.task_id[inverse == r]).tolist()
        if len(tasks) != 1:
            names = [demos.task_names[t] for t in tasks]
            raise ValueError(f"instruction ids {row} appear in several tasks {names}: the task is ambiguous")
        lookup[tuple(row)] = int(tasks[0])
    return lookup


def task_ids_from_instructions(
    instruction_ids: np.ndarray | Tensor,
    lookup: Mapping[tuple[int, ...], int],
    task_names: tuple[str, ...] | None = None,
) -> np.ndarray:
    """``instruction_ids [B, L]`` -> task indices ``[B]`` int64; ``ValueError`` on a row not in ``lookup``."""
    ids = np.asarray(instruction_ids).astype(np.int64, copy=False)
    if ids.ndim != 2:
        raise ValueError(f"instruction_ids must be [B, L], got shape {ids.shape}")
    out = np.empty(ids.shape[0], dtype=np.int64)
    for i, row in enumerate(ids.tolist()):
        task = lookup.get(tuple(row))
        if task is None:
            known = f" (known tasks: {list(task_names)})" if task_names else ""
            raise ValueError(
                f"unknown instruction ids {row}: not one of the {len(lookup)} instructions of the "
                f"demonstrations this policy was trained on{known}"
            )
        out[i] = task
    return out


def bc_act_fn(
    model: MLPBehaviourCloning,
    lookup: Mapping[tuple[int, ...], int],
    task_names: tuple[str, ...] | None = None,
) -> BatchActFn:
    """A deterministic :data:`~fastlight.evaluation.BatchActFn`: obs batch (``proprio [B, P]``,
    ``instruction_ids [B, L]``; other keys ignored), step ``[B]`` (unused) -> actions ``[B, A]`` float32."""
    model.eval()

    @torch.no_grad()
    def act(obs: dict[str, np.ndarray], step: np.ndarray) -> np.ndarray:
        task_id = torch.from_numpy(task_ids_from_instructions(obs["instruction_ids"], lookup, task_names))
        proprio = torch.as_tensor(np.asarray(obs["proprio"], dtype=np.float32))
        return model(proprio, task_id).numpy()

    return act


# ---------------------------------------------------------------------- training
def _proprio_stats(proprio: Tensor) -> tuple[Tensor, Tensor]:
    mean, std = proprio.mean(0), proprio.std(0)
    # Entries constant over the demonstrations (Meta-World pads unused object slots with 0) would
    # divide by ~0; leave them unscaled.
    std = torch.where(std > 1e-6, std, torch.ones_like(std))
    return mean, std


def train_bc(
    demos: Demos,
    *,
    hidden: tuple[int, ...] = (256, 256),
    lr: float = 1e-3,
    batch_size: int = 256,
    time_budget_s: float = 240.0,
    max_steps: int | None = None,
    seed: int = 0,
) -> tuple[MLPBehaviourCloning, dict[str, Any]]:
    """Behaviour-clone ``demos`` (``obs["proprio"] [N, P]``, ``task_id [N]`` -> ``actions [N, A]``).

    Adam on the MSE of the tanh output, minibatches of ``batch_size`` drawn as shuffled epochs, until
    ``time_budget_s`` seconds of training have passed or ``max_steps`` steps are done, whichever first
    (``time_budget_s=math.inf`` with ``max_steps`` makes a run reproducible step for step).

    Returns the model (in eval mode, on the CPU) and stats: ``steps``, ``seconds``, ``initial_loss`` /
    ``final_loss`` (mean MSE over the first / last ``LOSS_WINDOW`` steps), ``transitions``, ``epochs``.
    """
    if not time_budget_s > 0:
        raise ValueError(f"time_budget_s must be > 0, got {time_budget_s}")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if math.isinf(time_budget_s) and max_steps is None:
        raise ValueError("an infinite time_budget_s needs max_steps")
    if batch_size < 1 or lr <= 0:
        raise ValueError(f"batch_size must be >= 1 and lr > 0, got {batch_size} and {lr}")
    if "proprio" not in demos.obs:
        raise ValueError(
            f"the MLP baseline reads obs['proprio'], the demonstrations have {sorted(demos.obs)}"
        )
    if len(demos) == 0:
        raise ValueError("no demonstrations to train on")

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    proprio = demos.obs["proprio"].float()
    task_id = demos.task_id.long()
    actions = demos.actions.float()
    mean, std = _proprio_stats(proprio)
    model = MLPBehaviourCloning(proprio.shape[1], len(demos.task_names), actions.shape[1], hidden, mean, std)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    n = len(demos)
    losses: list[float] = []
    order, pos, epochs, steps = torch.randperm(n, generator=gen), 0, 0, 0
    t0 = time.perf_counter()
    while True:
        if max_steps is not None and steps >= max_steps:
            break
        if time.perf_counter() - t0 >= time_budget_s:
            break
        if pos >= n:  # a new shuffled epoch; the last minibatch of an epoch may be short
            order, pos, epochs = torch.randperm(n, generator=gen), 0, epochs + 1
        idx = order[pos : pos + batch_size]
        pos += batch_size
        loss = F.mse_loss(model(proprio[idx], task_id[idx]), actions[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        steps += 1
    seconds = time.perf_counter() - t0
    model.eval()
    stats = {
        "steps": steps,
        "seconds": seconds,
        "initial_loss": float(np.mean(losses[:LOSS_WINDOW])) if losses else math.nan,
        "final_loss": float(np.mean(losses[-LOSS_WINDOW:])) if losses else math.nan,
        "transitions": n,
        "epochs": epochs + pos / n,
        "hidden": list(model.hidden),
        "lr": lr,
        "batch_size": batch_size,
        "seed": seed,
    }
    return model, stats


# ---------------------------------------------------------------------- save / load
def _episodes_per_task(demos: Demos) -> dict[str, int]:
    counts = {name: 0 for name in demos.task_names}
    for k, name in enumerate(demos.task_names):
        counts[name] = int(torch.unique(demos.episode[demos.task_id == k]).numel())
    return counts


def save_bc(
    path: str | os.PathLike[str],
    model: MLPBehaviourCloning,
    demos: Demos,
    *,
    env_id: str,
    env_kwargs: dict[str, Any],
    stats: dict[str, Any],
) -> None:
    """``torch.save`` a plain dict (weights, sizes, env, task names, instruction lookup, stats) at
    ``path``, atomically (temporary file, then rename), so a half-written file is never loaded."""
    episodes = _episodes_per_task(demos)
    payload = {
        "format": SAVE_FORMAT,
        "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "sizes": {
            "proprio_dim": model.proprio_dim,
            "num_tasks": model.num_tasks,
            "action_dim": model.action_dim,
            "hidden": list(model.hidden),
        },
        "env_id": env_id,
        "env_kwargs": dict(env_kwargs),
        "task_names": list(demos.task_names),
        "instructions": [[list(row), task] for row, task in instruction_lookup(demos).items()],
        "stats": dict(stats),
        # The requested count is what most tasks reached; per-task counts show any shortfall.
        "demos_per_task": max(episodes.values(), default=0),
        "episodes_per_task": episodes,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_bc(path: str | os.PathLike[str]) -> tuple[BatchActFn, dict[str, Any]]:
    """The deterministic act function saved at ``path`` and its metadata (``env_id``, ``env_kwargs``,
    ``task_names``, ``stats``, ``demos_per_task``, ``episodes_per_task``, ``sizes``)."""
    # Plain containers and tensors only: the safe unpickler suffices.
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != SAVE_FORMAT:
        raise ValueError(f"{path} is not a fastlight BC baseline file (format {SAVE_FORMAT})")
    sizes = payload["sizes"]
    model = MLPBehaviourCloning(
        sizes["proprio_dim"], sizes["num_tasks"], sizes["action_dim"], tuple(sizes["hidden"])
    )
    model.load_state_dict(payload["state_dict"])
    task_names = tuple(payload["task_names"])
    lookup = {tuple(row): int(task) for row, task in payload["instructions"]}
    meta = {
        "env_id": payload["env_id"],
        "env_kwargs": payload["env_kwargs"],
        "task_names": task_names,
        "stats": payload["stats"],
        "demos_per_task": payload["demos_per_task"],
        "episodes_per_task": payload["episodes_per_task"],
        "sizes": sizes,
    }
    return bc_act_fn(model, lookup, task_names), meta


# ---------------------------------------------------------------------- CLI
DEFAULT_CONFIG = "configs/vla_metaworld_mt10_sft.yaml"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.vla.bc_baseline",
        description="Behaviour-clone a plain MLP on the scripted-expert demonstrations of an SFT config.",
    )
    p.add_argument(
        "--config",
        default=DEFAULT_CONFIG,
        help="SFT config whose data.init_args give env_id, env_kwargs, seed, cache_dir",
    )
    p.add_argument("--demos-per-task", type=int, default=30)
    p.add_argument("--time", type=float, default=240.0, help="training wall-clock budget, seconds")
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="stop after this many steps (default: the time budget only)",
    )
    p.add_argument("--out", default=None, help="output file (default runs/bc_mlp/mlp<demos-per-task>.pt)")
    p.add_argument(
        "--seed", type=int, default=None, help="training seed (default: the config's seed_everything, else 0)"
    )
    p.add_argument(
        "--demo-seed",
        type=int,
        default=None,
        help="demonstration seed (default: the config's data.init_args.seed, else 0)",
    )
    p.add_argument(
        "--cache-dir", default=None, help="demo cache (default: the config's, else runs/demo_cache)"
    )
    p.add_argument("--num-workers", type=int, default=None, help="demo generating processes, if not cached")
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--eval-episodes", type=int, default=0, help="evaluation episodes per task (0: none)")
    p.add_argument("--eval-seed", type=int, default=12_345)
    p.add_argument("--eval-batch", type=int, default=4, help="episodes played in lockstep")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: a 256-wide MLP gains nothing from more, and on a "
        "shared machine extra threads contend and run many times slower)",
    )
    return p


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Parsed flags and the config's ``data.init_args`` (a plain dict); ``SystemExit`` on bad input."""
    parser = build_parser()
    args = parser.parse_args(argv)
    nonneg = lambda v: v is None or v >= 0  # noqa: E731
    checks = (
        ("--time", args.time > 0 and math.isfinite(args.time), f"must be finite and > 0, got {args.time}"),
        ("--demos-per-task", args.demos_per_task >= 1, f"must be >= 1, got {args.demos_per_task}"),
        ("--max-steps", args.max_steps is None or args.max_steps >= 1, f"must be >= 1, got {args.max_steps}"),
        ("--eval-episodes", args.eval_episodes >= 0, f"must be >= 0, got {args.eval_episodes}"),
        ("--eval-batch", args.eval_batch >= 1, f"must be >= 1, got {args.eval_batch}"),
        ("--batch-size", args.batch_size >= 1, f"must be >= 1, got {args.batch_size}"),
        ("--lr", args.lr > 0, f"must be > 0, got {args.lr}"),
        ("--hidden", all(h >= 1 for h in args.hidden), f"widths must be >= 1, got {args.hidden}"),
        ("--num-workers", nonneg(args.num_workers), f"must be >= 0, got {args.num_workers}"),
        ("--threads", args.threads >= 1, f"must be >= 1, got {args.threads}"),
    )
    for flag, ok, why in checks:
        if not ok:
            parser.error(f"{flag} {why}")
    if not os.path.isfile(args.config):
        parser.error(f"--config: no such file {args.config!r}")
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.to_container(OmegaConf.load(args.config), resolve=True)
    except Exception as e:  # a YAML or interpolation error: report it against the flag
        parser.error(f"--config: cannot read {args.config!r}: {e}")
    if not isinstance(cfg, dict):
        parser.error(f"--config: {args.config!r} is not a mapping")
    data = cfg.get("data") or {}
    init_args = (data.get("init_args") or {}) if isinstance(data, dict) else {}
    if not isinstance(init_args, dict):
        parser.error(f"--config: data.init_args of {args.config!r} is not a mapping")
    if args.seed is None:
        seed = cfg.get("seed_everything")
        args.seed = int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else 0
    return args, init_args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train, save and (optionally) evaluate; returns the stats written with the model."""
    args, init_args = parse_args(argv)
    from fastlight.vla.demos import DemoDataModule

    torch.set_num_threads(args.threads)

    # The demonstrations are the VLA's: same env, demo seed and cache as the config's DemoDataModule
    # (its own defaults where the config is silent), only demos_per_task from the flag.
    dm_kwargs = {
        k: init_args[k]
        for k in (
            "env_id",
            "env_kwargs",
            "seed",
            "successful_only",
            "max_attempts_per_demo",
            "num_workers",
            "cache_dir",
        )
        if k in init_args
    }
    dm_kwargs["demos_per_task"] = args.demos_per_task
    overrides = {"seed": args.demo_seed, "cache_dir": args.cache_dir, "num_workers": args.num_workers}
    dm_kwargs.update({k: v for k, v in overrides.items() if v is not None})
    dm = DemoDataModule(**dm_kwargs)
    demos = dm.load()
    env_id, env_kwargs = dm.settings.env_id, dm.settings.env_kwargs

    model, stats = train_bc(
        demos,
        hidden=tuple(args.hidden),
        lr=args.lr,
        batch_size=args.batch_size,
        time_budget_s=args.time,
        max_steps=args.max_steps,
        seed=args.seed,
    )
    stats["demo_seed"] = dm.settings.seed
    out = args.out or f"runs/bc_mlp/mlp{args.demos_per_task}.pt"
    save_bc(out, model, demos, env_id=env_id, env_kwargs=env_kwargs, stats=stats)
    print(
        f"bc_mlp: {len(demos)} transitions ({args.demos_per_task} demos/task x "
        f"{len(demos.task_names)} tasks), hidden {list(model.hidden)}, {stats['steps']} steps in "
        f"{stats['seconds']:.0f} s ({stats['epochs']:.1f} epochs), loss {stats['initial_loss']:.4f} -> "
        f"final {stats['final_loss']:.4f} -> {out}",
        flush=True,
    )

    if args.eval_episodes > 0:
        from fastlight.evaluation import play_tasks

        act = bc_act_fn(model, instruction_lookup(demos), demos.task_names)
        t0 = time.perf_counter()
        episodes = play_tasks(
            act,
            env_id=env_id,
            env_kwargs=env_kwargs,
            episodes_per_task=args.eval_episodes,
            seed=args.eval_seed,
            batch=args.eval_batch,
        )
        per_task: dict[str, float] = {}
        for name in demos.task_names:
            wins = [e.success for e in episodes if e.task == name]
            per_task[name] = float(np.mean(wins))
            print(f"  {name:<26} {sum(wins):>3}/{len(wins)} = {per_task[name]:.0%}")
        mean = float(np.mean(list(per_task.values())))
        print(
            f"bc_mlp: mean success {mean:.3f} over {len(per_task)} tasks x {args.eval_episodes} episodes "
            f"(eval seed {args.eval_seed}, {time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
        # Keep the result with the model it measures.
        stats["eval"] = {
            "episodes_per_task": args.eval_episodes,
            "seed": args.eval_seed,
            "success": per_task,
            "mean_success": mean,
        }
        save_bc(out, model, demos, env_id=env_id, env_kwargs=env_kwargs, stats=stats)
    return stats


if __name__ == "__main__":
    main()
