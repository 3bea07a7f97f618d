"""Self-imitation of successful episodes: the steps to imitate, and the per-task buffer that keeps them.

Self-Imitation Learning (Oh et al., 2018, "Self-Imitation Learning", ICML) adds to an on-policy
actor-critic a term that imitates the agent's own past decisions that led to good outcomes. Here the
good outcome is success, as in ReST / RAFT-style self-training: the VLA envs end an episode at success
(``terminate_on_success``), so an episode whose last step is ``terminated`` succeeded.

The buffer is per task (``task_id``), so frequent easy tasks cannot crowd out the rare successes of a
hard one. With action chunks the chunk steps never executed are left out of imitation, as in SFT.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fastlight.rollout import Obs, Rollout


def successful_steps(*, terminated: Tensor, truncated: Tensor, valid: Tensor) -> Tensor:
    """Valid steps of the episodes that end, inside this rollout, with ``terminated``.

    Shapes: ``[T, E]`` bool each; returns ``[T, E]`` bool. A step belongs to the episode whose end
    is the first done (terminated or truncated) step at or after it in its env column; steps after
    a column's last done step (padding, DPSA dummy steps) are never selected.
    """
    if not (terminated.shape == truncated.shape == valid.shape) or terminated.dim() != 2:
        raise ValueError(
            f"terminated, truncated, valid must be [T, E] of one shape, got {tuple(terminated.shape)}, "
            f"{tuple(truncated.shape)}, {tuple(valid.shape)}"
        )
    done = terminated | truncated
    ends_in_success = torch.zeros_like(terminated[0])
    out = torch.zeros_like(terminated)
    for t in range(terminated.shape[0] - 1, -1, -1):
        ends_in_success = torch.where(done[t], terminated[t], ends_in_success)
        out[t] = ends_in_success & valid[t]
    return out


class SuccessBuffer:
    """Per-task FIFO of the steps of successful episodes: observations and action bins (and, with action
    chunks, which bins were executed), on the CPU; :meth:`state_dict` carries it in a checkpoint.

    Args:
        capacity: steps kept per task; the oldest go first.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"SuccessBuffer capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._tasks: dict[int, dict[str, Tensor]] = {}  # task -> {"obs.<key>" | "actions": [n, ...]}
        self.episodes_added = 0

    def __len__(self) -> int:
        return sum(len(d["actions"]) for d in self._tasks.values())

    def steps_per_task(self) -> dict[int, int]:
        return {task: len(d["actions"]) for task, d in sorted(self._tasks.items())}

    def add_rollout(self, rollout: Rollout) -> int:
        """Keep the steps of the rollout's successful episodes; returns how many steps were added."""
        keep = successful_steps(
            terminated=rollout.terminated, truncated=rollout.truncated, valid=rollout.valid
        )
        if not bool(keep.any()):
            return 0
        self.episodes_added += int((keep & rollout.terminated).sum())
        idx = keep.reshape(-1).nonzero().squeeze(-1)
        obs = rollout.flat("obs")
        fields = {"actions": rollout.flat("actions")[idx]}
        if rollout.chunked:
            fields["valid"] = self._token_valid(rollout, idx)
        if isinstance(obs, dict):
            fields.update({f"obs.{k}": v[idx] for k, v in obs.items()})
        else:
            fields["obs"] = obs[idx]
        task = rollout.flat("task_id")[idx]
        for t in task.unique().tolist():
            rows = task == t
            self._append(int(t), {k: v[rows].detach().cpu() for k, v in fields.items()})
        return int(idx.numel())

    @staticmethod
    def _token_valid(rollout: Rollout, idx: Tensor) -> Tensor:
        """``[n, K]`` bool: the tokens of the chunk steps the env executed (``h < env_steps``), for the flat
        transitions ``idx`` (step-major; ``K`` from the log-probs: a flow policy's actions are a chain)."""
        k, h = rollout.logprobs.shape[-1], rollout.step_rewards.shape[2]
        if rollout.logprobs.dim() != 3 or k % h:
            raise ValueError(
                f"SuccessBuffer: chunked log-probs must be [T, E, K] with K a multiple of the chunk "
                f"H={h}, got {tuple(rollout.logprobs.shape)}"
            )
        chunk_step = torch.arange(k, device=idx.device) // (k // h)  # [K]
        return chunk_step[None] < rollout.flat("env_steps")[idx][:, None]

    def _append(self, task: int, fields: dict[str, Tensor]) -> None:
        old = self._tasks.get(task)
        if old is not None:
            if ("valid" in old) != ("valid" in fields):
                raise ValueError(
                    "SuccessBuffer: rollouts with and without action chunks cannot share a buffer"
                )
            if old.keys() != fields.keys():
                raise ValueError(
                    f"SuccessBuffer: observation keys changed from {sorted(old)} to {sorted(fields)}"
                )
            fields = {k: torch.cat([old[k], v]) for k, v in fields.items()}
        self._tasks[task] = {k: v[-self.capacity :] for k, v in fields.items()}

    def sample(
        self, n: int, *, generator: torch.Generator | None = None
    ) -> tuple[Obs, Tensor, Tensor | None]:
        """``n`` steps: a task uniformly among those with any, then a step of it uniformly.

        Returns ``(obs, actions, valid)``: ``obs`` a dict ``[n, ...]`` per key (or a tensor), ``actions
        [n, ...]``, ``valid`` ``[n, K]`` bool with action chunks (``None`` without). Raises ``ValueError``
        on an empty buffer.
        """
        if not self._tasks:
            raise ValueError("SuccessBuffer.sample: the buffer is empty")
        tasks = sorted(self._tasks)
        which = torch.randint(len(tasks), (n,), generator=generator)
        parts: list[dict[str, Tensor]] = []
        for i, task in enumerate(tasks):
            m = int((which == i).sum())
            if m == 0:
                continue
            d = self._tasks[task]
            rows = torch.randint(len(d["actions"]), (m,), generator=generator)
            parts.append({k: v[rows] for k, v in d.items()})
        batch = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        actions, valid = batch.pop("actions"), batch.pop("valid", None)
        if "obs" in batch:
            return batch["obs"], actions, valid
        return {k[len("obs.") :]: v for k, v in batch.items()}, actions, valid

    def state_dict(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "episodes_added": self.episodes_added, "tasks": dict(self._tasks)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episodes_added = int(state["episodes_added"])
        self._tasks = {
            int(t): {k: v[-self.capacity :] for k, v in f.items()} for t, f in state["tasks"].items()
        }


def buffers_for_world_size(
    states: list[dict[str, Any]], world_size: int, capacity: int
) -> list[dict[str, Any]]:
    """Map the saved ranks' :meth:`SuccessBuffer.state_dict` entries onto ``world_size`` ranks.

    The same number of ranks keeps each rank's own buffer. Another number pools each task's steps (at
    most ``capacity * world_size``, each saved rank's newest, equal shares) and deals them round-robin
    (pooled step ``i`` to rank ``i % world_size``), so every new rank holds about the same number of each
    task's steps, at most ``capacity``; ``episodes_added`` of rank ``r`` sums the old ranks ``j`` with
    ``j % world_size == r``. Raises a one-line ``ValueError`` when the saved buffers of one task hold
    different fields (with and without action chunks, other observation keys).
    """
    if len(states) == world_size:
        return states
    pooled: dict[int, dict[str, Tensor]] = {}
    for task in sorted({int(t) for s in states for t in s["tasks"]}):
        parts = [s["tasks"][t] for s in states for t in s["tasks"] if int(t) == task]
        keys = sorted(parts[0])
        for p in parts[1:]:
            if sorted(p) != keys:
                raise ValueError(
                    f"--ckpt_path: the saved ranks' self-imitation buffers of task {task} hold different "
                    f"fields ({keys} and {sorted(p)}), so they cannot be merged onto {world_size} rank(s)"
                )
        kept = _fair_shares([len(p["actions"]) for p in parts], capacity * world_size)
        pooled[task] = {
            k: torch.cat([p[k][len(p[k]) - n :] for p, n in zip(parts, kept, strict=True)]) for k in keys
        }
    out = []
    for r in range(world_size):
        tasks = {t: {k: v[r::world_size] for k, v in f.items()} for t, f in pooled.items()}
        episodes = sum(int(s["episodes_added"]) for j, s in enumerate(states) if j % world_size == r)
        kept_tasks = {t: f for t, f in tasks.items() if len(f["actions"])}
        out.append({"capacity": capacity, "episodes_added": episodes, "tasks": kept_tasks})
    return out


def _fair_shares(sizes: list[int], total: int) -> list[int]:
    """How many of each part's newest items to keep, at most ``total`` in all: equal shares, a part
    with fewer than its share giving the rest to the others."""
    kept = [0] * len(sizes)
    left = min(total, sum(sizes))
    while left:
        open_parts = [i for i, s in enumerate(sizes) if kept[i] < s]
        share = max(left // len(open_parts), 1)
        for i in open_parts:
            n = min(share, sizes[i] - kept[i], left)
            kept[i] += n
            left -= n
    return kept
