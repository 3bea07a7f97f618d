"""What a sampler is given: its :class:`SamplerConfig` (plain, picklable settings) and the handles it
shares with the trainer (made once per rank by :class:`RankHandles`), in one :class:`SamplerBundle`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from torch import nn

from fastlight.envs.wrappers import AnyEnvWrapper
from fastlight.sampling.exact import SamplerState
from fastlight.sampling.round_signal import RoundSignal, RoundView
from fastlight.sampling.task_weights import SharedTaskWeights
from fastlight.weights.publisher import WeightSource


@dataclass
class SamplerConfig:
    """Everything a sampler needs to build its envs and Collector (picklable); a field named like a
    ``--data`` setting holds that setting."""

    env_id: str
    num_envs: int
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    reset_mode: str = "dpsa"
    termination_threshold: float | str = 0.5  # or "auto"
    max_horizon: int = 200
    rollout_steps: int = 128
    cycles_per_step: int = 1
    #: Keep collecting whole cycles past ``cycles_per_step`` until this many valid transitions (0 = off).
    min_valid_steps: int = 0
    max_staleness: int = 0
    env_wrappers: tuple[AnyEnvWrapper, ...] = ()
    seed: int = 0
    group_size: int = 1
    nonfinite: str = "raise"
    #: ``--data.rank_rounds`` resolved (``together``: the bundle's ``rounds`` signal).
    rank_rounds: Literal["together", "apart"] = "apart"
    #: Where the sampler of this index stood in the checkpoint resumed from (applied once, when the
    #: first weights it loads are the version after it: not on a later restart).
    resume: SamplerState | None = None
    exact_resume: bool = False

    def build_envs(self) -> list:
        """The sampler's envs: ``make_env``, inside the env wrappers."""
        from fastlight.envs.registry import make_env
        from fastlight.envs.wrappers import wrap_env

        envs = [make_env(self.env_id, env_kwargs=self.env_kwargs) for _ in range(self.num_envs)]
        return [wrap_env(e, self.env_wrappers) for e in envs]


class StopSignal(Protocol):
    """The fleet's stop request: a :class:`~fastlight.procs.StopFlag` (processes) or a
    ``threading.Event`` (a Ray actor)."""

    def is_set(self) -> bool: ...


@dataclass
class SamplerBundle:
    """Everything sampler ``index`` starts with: its config and the handles it shares with the trainer.

    Built by the fleet and passed whole to the sampler (shared-memory handles travel by inheritance).

    Args:
        index: the sampler's index in its rank.
        config: its settings.
        policy: its policy copy (or a remote policy served by the inference worker).
        weights: where newer published weights come from.
        beat: called on every env step, reset and wait (the trainer's watch of this sampler).
        stop: the fleet's stop request.
        task_weights: DWR's task-sampling weights, applied before each round (``None``: none).
        rounds: its view of the rank's round signal, with ``config.rank_rounds`` ``together``.
    """

    index: int
    config: SamplerConfig
    policy: nn.Module
    weights: WeightSource
    beat: Callable[[], None]
    stop: StopSignal
    task_weights: SharedTaskWeights | None = None
    rounds: RoundView | None = None

    def __post_init__(self) -> None:
        if (self.config.rank_rounds == "together") != (self.rounds is not None):
            raise ValueError(
                f"sampler {self.index}: rank_rounds {self.config.rank_rounds!r} "
                f"{'takes no' if self.rounds is not None else 'needs a'} round signal"
            )


class RankHandles:
    """What a rank's sampler processes share with the trainer and each other, made once before they
    start (the trainer keeps this; :meth:`bundle` gives each sampler its views).

    Args:
        ctx: the multiprocessing context the samplers start with.
        configs: the rank's sampler configs, by index.
    """

    def __init__(self, ctx: Any, configs: Sequence[SamplerConfig]) -> None:
        self.task_weights = SharedTaskWeights(ctx)
        together = {c.rank_rounds == "together" for c in configs}
        if len(together) > 1:
            raise ValueError("rank_rounds must be the same for every sampler of a rank")
        self.rounds: RoundSignal | None = None
        if together == {True}:
            shared_rate = configs[0].max_staleness == 0
            self.rounds = RoundSignal(ctx, [c.num_envs for c in configs], shared_rate=shared_rate)

    def bundle(
        self,
        index: int,
        config: SamplerConfig,
        *,
        policy: nn.Module,
        weights: WeightSource,
        beat: Callable[[], None],
        stop: StopSignal,
    ) -> SamplerBundle:
        """Sampler ``index``'s bundle: its own ``policy``, ``weights`` and ``beat``, the rank's handles."""
        rounds = self.rounds.view(index) if self.rounds is not None else None
        return SamplerBundle(index, config, policy, weights, beat, stop, self.task_weights, rounds)
