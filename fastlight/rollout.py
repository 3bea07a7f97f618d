"""The one batch contract of fastlight: a time-major ``Rollout`` of shape ``[T, E, ...]``.

Every sampler produces Rollouts, every module consumes them. Fields:

=================  ==================  ===========================================================
field              shape               meaning
=================  ==================  ===========================================================
obs                [T, E, *obs] or     observation *before* step t (a dict of tensors for
                   dict of such        multi-modal observations, e.g. image + proprio + text ids)
actions            [T, E, *act]        action taken at step t (long for discrete / tokens)
logprobs           [T, E] or [T, E, K] behaviour log-prob (K = action tokens for a VLA policy)
values             [T, E]              behaviour critic's V(s_t)
rewards            [T, E]              reward of step t
terminated         [T, E] bool         the MDP ended at t: no bootstrap
truncated          [T, E] bool         cut at t (unified truncation, time limit, rollout end):
                                       bootstrap from ``bootstrap_values[t]`` = V(s_{t+1})
valid              [T, E] bool         real transition; ``False`` = DPSA dummy step or padding
step               [T, E] long         index of step t inside its episode
task_id            [T, E] long         task of the episode (multi-task envs), else 0
policy_version     [T, E] long         version of the weights that chose the action
bootstrap_values   [T, E]              V(s_{t+1}) where ``truncated``, else 0
step_rewards       [T, E, H] or None   action chunks only: the raw reward of each env step of the
                                       chunk executed at t, 0 past the ``env_steps[t]`` executed
env_steps          [T, E] long or None action chunks only: env steps executed at t (``1..H`` where
                                       valid, 0 elsewhere)
stats              RolloutStats        the sampler's counters and finished episodes
=================  ==================  ===========================================================

**Action chunks** (:class:`~fastlight.models.action_mapping.ChunkedActionMapping`, ``H`` env actions
per call): one transition per chunk; step t executes up to ``H`` env steps open-loop, stopping early
where the episode (or the cycle's env-step budget) ends. ``rewards[t]`` is then the chunk's undiscounted
reward sum, ``step`` the episode's env step at the chunk's start, ``bootstrap_values[t]`` V of the
state after the last executed step; the learner discounts (:func:`fastlight.advantages.chunk_rewards`).

Invariant (:meth:`Rollout.validate`): in an env column a valid step that does not end its episode is
followed by a valid step of the same episode, so the last valid step of every column is terminated or
truncated: padding never sits *inside* an episode, and the masked GAE never reads it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor

Obs = Tensor | dict[str, Tensor]

#: Per-step fields that only action-chunk Rollouts carry (``None`` otherwise).
CHUNK_FIELDS = ("step_rewards", "env_steps")
#: RolloutStats fields that do not add up in :meth:`RolloutStats.merge`.
_NOT_SUMMED = ("sampler", "sampler_states")


#: The info keys that report success: Meta-World's ``success``, gymnasium-robotics' ``is_success``.
SUCCESS_KEYS = ("success", "is_success")


def success_after(success: bool | None, info: Mapping[str, Any]) -> bool | None:
    """The episode's success verdict after one more step: fastlight's one rule for success.

    An episode succeeded if *any* of its steps reported success under either of :data:`SUCCESS_KEYS`
    (as the Meta-World / AcceRL evaluations count it). ``success`` is the verdict so far (``None``
    before the first step); a step whose info has neither key leaves it, so ``None`` at the end means
    the env never reports success."""
    for key in SUCCESS_KEYS:
        if key in info:
            success = bool(success) or bool(info[key])
    return success


def crashed_at_end(info: Mapping[str, Any]) -> bool | None:
    """highway-env's ``info['crashed']`` of an episode's last step; ``None``: the env does not report it."""
    return bool(info["crashed"]) if "crashed" in info else None


@dataclass
class EpisodeRecord:
    """One finished (or truncated) episode: the learner's and the evaluation's one record. ``length`` is
    the number of valid steps the trajectory contributed; one cut by a unified truncation counts at its
    cut length (FAST §short-time bias) and is marked ``cut`` (its outcome unknown). ``success`` follows
    :func:`success_after`, ``crashed`` :func:`crashed_at_end` (``None``: not reported); ``info`` keeps the
    last step's numeric info entries. The evaluation also fills in ``seed``, ``task`` and ``frames``."""

    length: int
    ret: float
    terminated: bool
    truncated: bool
    task_id: int = 0
    success: bool | None = None
    crashed: bool | None = None
    cut: bool = False
    info: dict[str, float] = field(default_factory=dict)
    seed: int | None = None
    task: str | None = None
    frames: list[Any] = field(default_factory=list, repr=False, compare=False)  # uint8 [H, W, 3] each


@dataclass
class RolloutStats:
    """Sampler counters over the cycle(s) that produced a Rollout (FAST §effective throughput).

    ``raw_steps`` counts every transition slot (dummy steps included), ``valid_steps`` only the real ones,
    both in env steps: with action chunks a slot spans the chunk's env-step budget (``H``, less where the
    cycle's budget ran out) and a valid transition counts the env steps it executed. Times are seconds:
    ``step_time`` inside ``env.step``, ``reset_time`` inside ``env.reset`` (wall time of the, possibly
    overlapped, resets), ``wall_time`` the whole sampling cycle, policy inference and waiting included."""

    raw_steps: int = 0
    valid_steps: int = 0
    step_time: float = 0.0
    reset_time: float = 0.0
    wall_time: float = 0.0
    global_resets: int = 0
    episodes: list[EpisodeRecord] = field(default_factory=list)
    #: Trainer side (set by the DataModule): the step's wait for this batch, stale items dropped.
    data_wait_s: float = 0.0
    dropped_stale: int = 0
    #: Episodes dropped because the env returned a NaN / inf (``--data.nonfinite drop``).
    dropped_nonfinite: int = 0
    #: Sum of the DPSA termination thresholds of the cycles (one per ``global_resets`` in dpsa
    #: mode): their mean is what ``termination_threshold: auto`` chose.
    threshold_sum: float = 0.0
    #: Rounds the trainer cut in flight (:mod:`fastlight.sampling.round_signal`).
    cut_in_flight: int = 0
    #: The sampler (its index in the rank) that sent this Rollout, -1 for a batch of several.
    sampler: int = -1
    #: Each sending sampler's :class:`~fastlight.sampling.exact.SamplerState` after its round.
    sampler_states: dict[int, Any] = field(default_factory=dict)
    #: ``(receiver, version, checksum)`` of the weights that sampled it, one per sampler item, for
    #: the trainer's :class:`~fastlight.weights.checksum.DeliveryCheck`.
    weights_held: list[tuple[str, int, float]] = field(default_factory=list)

    def merge(self, other: RolloutStats) -> RolloutStats:
        """Counters of two cycles taken one after the other: counts, times and lists add up, the
        sampler states join, and ``sampler`` is -1 unless both are one sampler's."""
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name)
                  for f in fields(self) if f.name not in _NOT_SUMMED}  # fmt: skip
        return RolloutStats(
            **summed,
            sampler=self.sampler if self.sampler == other.sampler else -1,
            sampler_states=self.sampler_states | other.sampler_states,
        )


def _cat(parts: list[Obs], dim: int) -> Obs:
    if isinstance(parts[0], dict):
        return {k: torch.cat([p[k] for p in parts], dim=dim) for k in parts[0]}
    return torch.cat(parts, dim=dim)


@dataclass
class Rollout:
    """Time-major batch ``[T, E, ...]``; see the module docstring for each field."""

    obs: Obs
    actions: Tensor
    logprobs: Tensor
    values: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    valid: Tensor
    step: Tensor
    task_id: Tensor
    policy_version: Tensor
    bootstrap_values: Tensor
    stats: RolloutStats = field(default_factory=RolloutStats)
    step_rewards: Tensor | None = None
    env_steps: Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """``(T, E)``."""
        return tuple(self.valid.shape)  # type: ignore[return-value]

    @property
    def num_valid(self) -> int:
        return int(self.valid.sum())

    @property
    def chunked(self) -> bool:
        """Whether the transitions are action chunks (``step_rewards`` / ``env_steps`` present)."""
        return self.env_steps is not None

    @property
    def num_env_steps(self) -> int:
        """Env steps behind the valid transitions (``num_valid`` without action chunks)."""
        return int(self.env_steps.sum()) if self.env_steps is not None else self.num_valid

    def _fields(self) -> tuple[str, ...]:
        """The per-step fields this Rollout carries (obs first)."""
        return STEP_FIELDS + (CHUNK_FIELDS if self.chunked else ())

    def validate(self) -> Rollout:
        """Check shapes, dtypes and the padding invariant; raise ``ValueError`` naming the field."""
        te = self.shape
        if len(te) != 2:
            raise ValueError(f"Rollout.valid must be [T, E], got shape {tuple(self.valid.shape)}")
        first = next(iter(self.obs.values())) if isinstance(self.obs, dict) else self.obs
        if tuple(first.shape[:2]) != te:
            raise ValueError(f"Rollout.obs leading shape {tuple(first.shape[:2])} != valid shape {te}")
        if (self.step_rewards is None) != (self.env_steps is None):
            raise ValueError("Rollout: step_rewards and env_steps come together (action chunks) or not")
        for name in self._fields()[1:]:
            t = getattr(self, name)
            if tuple(t.shape[:2]) != te:
                raise ValueError(f"Rollout.{name} leading shape {tuple(t.shape[:2])} != valid shape {te}")
        if self.chunked:
            self._validate_chunks()
        for name in ("terminated", "truncated", "valid"):
            if getattr(self, name).dtype != torch.bool:
                raise ValueError(f"Rollout.{name} must be bool, got {getattr(self, name).dtype}")
        if bool((self.terminated & self.truncated).any()):
            raise ValueError("Rollout: a step cannot be both terminated and truncated")
        done = self.terminated | self.truncated
        inner = self.valid[:-1] & ~done[:-1]
        if bool((inner & ~self.valid[1:]).any()):
            raise ValueError("Rollout: padding found inside an episode (valid step not done, next invalid)")
        if bool((self.valid[-1] & ~done[-1]).any()):
            raise ValueError("Rollout: the last valid step of every env must be terminated or truncated")
        return self

    def _validate_chunks(self) -> None:
        steps, valid = self.env_steps, self.valid
        if self.step_rewards.dim() != 3:
            raise ValueError(f"Rollout.step_rewards must be [T, E, H], got {tuple(self.step_rewards.shape)}")
        h = self.step_rewards.shape[2]
        if steps.is_floating_point() or bool((valid & ((steps < 1) | (steps > h))).any()):
            raise ValueError(f"Rollout.env_steps must be integers in [1, H={h}] on valid transitions")
        if bool((~valid & (steps != 0)).any()):
            raise ValueError("Rollout.env_steps must be 0 on padding")

    def map(self, fn) -> Rollout:
        """Apply ``fn`` to every per-step tensor (obs dicts included); stats are kept."""
        kw = {name: fn(getattr(self, name)) for name in self._fields()[1:]}
        obs = {k: fn(v) for k, v in self.obs.items()} if isinstance(self.obs, dict) else fn(self.obs)
        return replace(self, obs=obs, **kw)

    def pad_to(self, horizon: int) -> Rollout:
        """Append ``horizon - T`` padding rows (``valid=False``, zeros) at the end of time."""
        t_len = self.shape[0]
        if horizon < t_len:
            raise ValueError(f"pad_to: horizon {horizon} < current T {t_len}")
        if horizon == t_len:
            return self
        return self.map(lambda t: torch.cat([t, t.new_zeros((horizon - t_len, *t.shape[1:]))], dim=0))

    @staticmethod
    def cat(rollouts: list[Rollout], dim: int = 1) -> Rollout:
        """Join rollouts along E (``dim=1``: a super-batch, T padded to the longest with ``valid=False``
        steps, which the SMPO reduction ignores) or along T (``dim=0``: consecutive cycles of the same E
        envs; every cycle ends each column with a done step (see ``validate``), so the masked GAE never
        carries across the seam). Their stats are merged."""
        if not rollouts or dim not in (0, 1):
            raise ValueError(f"Rollout.cat needs at least one rollout and dim 0 or 1, got dim {dim}")
        if dim == 1:
            horizon = max(r.shape[0] for r in rollouts)
            rollouts = [r.pad_to(horizon) for r in rollouts]
        elif len(envs := {r.shape[1] for r in rollouts}) != 1:
            raise ValueError(f"Rollout.cat along T needs the same E in every rollout, got {sorted(envs)}")
        kw = {name: _cat([getattr(r, name) for r in rollouts], dim) for name in _joint_fields(rollouts)}
        return Rollout(**kw, stats=functools.reduce(RolloutStats.merge, [r.stats for r in rollouts]))

    def flat(self, name: str) -> Tensor | dict[str, Tensor]:
        """Field ``name`` flattened over ``[T, E]`` to ``[T*E, ...]``."""
        t = getattr(self, name)
        if isinstance(t, dict):
            return {k: v.reshape(-1, *v.shape[2:]) for k, v in t.items()}
        return t.reshape(-1, *t.shape[2:])


def _joint_fields(rollouts: list[Rollout]) -> tuple[str, ...]:
    """The per-step fields of rollouts to be joined: all chunked with one ``H``, or none chunked."""
    kinds = {r.step_rewards.shape[2] if r.chunked else None for r in rollouts}
    if len(kinds) != 1:
        shown = sorted("no chunks" if k is None else f"H={k}" for k in kinds)
        raise ValueError(f"Rollout.cat needs rollouts with the same action chunks, got {shown}")
    return rollouts[0]._fields()


#: Per-step fields, in a fixed order (obs first; it may be a dict).
STEP_FIELDS = tuple(f.name for f in fields(Rollout) if f.name not in ("stats", *CHUNK_FIELDS))
