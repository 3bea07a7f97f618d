"""The policy interface every fastlight module and sampler talks to.

A policy is an ``nn.Module`` with these methods over a flat batch ``[N, ...]`` of observations (a
tensor, or a dict of tensors) and the episode step index ``step`` (``[N]`` long, ignored by policies
that do not use it):

- ``act(obs, step=..., deterministic=False) -> ActOutput``: sample actions for acting;
- ``evaluate(obs, actions, step=...) -> EvalOutput``: log-probs, entropy and values of given actions,
  with gradients, for the loss;
- ``value(obs, step=...) -> Tensor [N]``: the critic alone (value recomputation, bootstrap);
- ``action_mapping() -> ActionMapping``: the picklable map from its actions to env actions
  (:mod:`fastlight.models.action_mapping`), which an inference-served sampler applies;
- ``env_action(actions) -> Tensor``: that mapping applied (what ``env.step`` receives).

``logprobs`` and ``entropy`` are ``[N]`` for single-distribution policies and ``[N, K]`` for
token policies (one entry per action token), which is what token-level ratios need. The VLA kinds
(:class:`VLAKind`) are :class:`TokenPolicy` and :class:`FlowPolicy`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import NamedTuple, Protocol, runtime_checkable

from torch import Tensor, nn

Obs = Tensor | dict[str, Tensor]


class ActOutput(NamedTuple):
    actions: Tensor
    logprobs: Tensor
    values: Tensor


class EvalOutput(NamedTuple):
    logprobs: Tensor
    entropy: Tensor
    values: Tensor


@runtime_checkable
class ActionMapping(Protocol):
    """Policy actions ``[N, ...]`` -> env actions ``[N, ...]``; must pickle without the policy."""

    def __call__(self, actions: Tensor) -> Tensor: ...


@runtime_checkable
class Policy(Protocol):
    def act(self, obs: Obs, *, step: Tensor | None = None, deterministic: bool = False) -> ActOutput: ...

    def evaluate(self, obs: Obs, actions: Tensor, *, step: Tensor | None = None) -> EvalOutput: ...

    def value(self, obs: Obs, *, step: Tensor | None = None) -> Tensor: ...

    def action_mapping(self) -> ActionMapping: ...

    def env_action(self, actions: Tensor) -> Tensor: ...


class PolicyBase(nn.Module, ABC):
    """The base class of a user's own policy: an ``nn.Module`` that implements :class:`Policy`.

    Subclasses implement ``act``, ``evaluate``, ``value`` and ``action_mapping`` (a subclass that forgets
    one cannot be instantiated); ``env_action`` applies the mapping, so it cannot disagree with what an
    inference-served sampler applies.
    """

    @abstractmethod
    def act(self, obs: Obs, *, step: Tensor | None = None, deterministic: bool = False) -> ActOutput: ...

    @abstractmethod
    def evaluate(self, obs: Obs, actions: Tensor, *, step: Tensor | None = None) -> EvalOutput: ...

    @abstractmethod
    def value(self, obs: Obs, *, step: Tensor | None = None) -> Tensor: ...

    @abstractmethod
    def action_mapping(self) -> ActionMapping: ...

    def env_action(self, actions: Tensor) -> Tensor:
        """``action_mapping()`` applied: policy actions ``[N, ...]`` -> what ``env.step`` receives."""
        return self.action_mapping()(actions)


@runtime_checkable
class ServedPolicy(Policy, Protocol):
    """A policy whose answers come from another process (the inference worker's
    :class:`~fastlight.inference.remote.RemotePolicy`): ``last_version`` is the version of the
    weights behind the latest answer (it may change mid-round), and ``new_round(beat)`` resets the
    progress by which the worker serves stragglers first; ``beat`` (the sampler's heartbeat) is called
    while an answer is awaited, so a hung worker, not the samplers waiting on it, is the silent one.
    ``last_checksum`` is the worker's :func:`~fastlight.weights.checksum.delivery_checksum` of those
    weights (NaN before its first sync), which the sampler reports to the trainer's delivery check."""

    last_version: int
    last_checksum: float

    def new_round(self, beat: Callable[[], None]) -> None: ...


POLICY_METHODS = ("act", "evaluate", "value", "action_mapping", "env_action")


def check_policy(policy: object) -> None:
    """Raise ``TypeError`` naming what ``policy`` lacks of the :class:`Policy` interface (without
    ``action_mapping`` a VLA's bins would reach ``env.step`` unmapped, silently)."""
    missing = [m for m in POLICY_METHODS if not callable(getattr(type(policy), m, None))]
    if missing:
        raise TypeError(
            f"{type(policy).__name__} does not implement fastlight.models.base.Policy: missing "
            f"{', '.join(missing)} (see fastlight.models.action_mapping for action_mapping)"
        )


@runtime_checkable
class ActionBins(Protocol):
    """Continuous env actions ``[...]`` in the env's range -> long bins ``[...]`` in ``[0, n_bins)``
    (element-wise), e.g. :class:`~fastlight.models.action_tokenizer.ActionTokenizer`."""

    n_bins: int

    def encode(self, actions: Tensor) -> Tensor: ...


@runtime_checkable
class VLAKind(Policy, Protocol):
    """What :class:`~fastlight.vla.module.VLAModule` and :class:`~fastlight.vla.sft.VLASFTModule` train (an
    ``nn.Module``), which every VLA kind (:class:`TokenPolicy`, :class:`FlowPolicy`) implements:

    - ``imitation_loss(obs, actions, valid [N] | [N, K] | None, *, own=False, **targets) -> (loss, info)``
      (SFT, self-imitation; ``info``: detached metrics) of continuous env actions ``[N, K]`` (step-major)
      or, with ``own``, of its own as ``act`` gave them; ``targets``: ``label_smoothing`` / ``bin_sigma`` of
      :func:`~fastlight.vla.imitation_loss.token_cross_entropy`, which other kinds ignore;
    - ``policy_parameters()`` / ``value_parameters()``: the actor's and the critic's parameters (disjoint;
      the critic has its own learning rate, ``--model.value_lr``, and may be missing from an SFT
      checkpoint); frozen ones may be included, the optimizers skip them;
    - ``action_dim``: the env's action dimensions (``VLAModule.check_env_spec`` compares it).
    """

    action_dim: int

    def imitation_loss(
        self, obs: Obs, actions: Tensor, valid: Tensor | None = None, *, own: bool = False, **targets: float
    ) -> tuple[Tensor, dict[str, Tensor]]: ...
    def policy_parameters(self) -> list[nn.Parameter]: ...
    def value_parameters(self) -> list[nn.Parameter]: ...


@runtime_checkable
class TokenPolicy(VLAKind, Protocol):
    """A :class:`VLAKind` over action tokens:

    - ``act`` / ``evaluate``: ``actions`` are bins ``[N, K]`` (long), ``logprobs`` / ``entropy`` per token
      ``[N, K]``, ``values`` ``[N]``;
    - ``forward(obs, actions=None) -> (logits [N, K, n_bins], hidden)``: the untempered action-bin logits,
      with gradients; ``actions``: target bins ``[N, K]`` to teacher-force; ``hidden``: the policy's choice;
    - ``action_tokenizer``: :class:`ActionBins`, the demonstrations' continuous actions -> bins.

    A policy acting in chunks of ``H`` env actions (``K = H x action_dim`` tokens) says so with its
    mapping (:class:`~fastlight.models.action_mapping.ChunkedActionMapping`). Optional:
    :class:`ChecksObsSpace`.
    """

    action_tokenizer: ActionBins

    def forward(self, obs: Obs, actions: Tensor | None = None) -> tuple[Tensor, Tensor]: ...


@runtime_checkable
class FlowPolicy(VLAKind, Protocol):
    """A flow-matching :class:`VLAKind` (:class:`~fastlight.vla.flow_policy.FlowVLAPolicy`: pi0, flow-SDE):

    - ``act`` / ``evaluate``: ``actions`` are float rows ``[N, W]`` holding what the policy needs to score
      its sample again (its denoising chain); ``logprobs`` / ``entropy`` ``[N, K]``, one per executed
      action entry (``K = H x action_dim``), so token-level ratios apply; ``env_action``: the executed chunk;
    - ``flow_matching_loss(obs, actions [N, K], valid)``: its ``imitation_loss`` of continuous actions.
    """

    def flow_matching_loss(
        self, obs: Obs, actions: Tensor, valid: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


@runtime_checkable
class ShardsBlocks(Protocol):
    """A policy that names the classes of its transformer blocks, FSDP2's units under
    ``--trainer.strategy fsdp2`` (:func:`fastlight.modules.sharding.shard_policy`); a policy without
    this method is sharded as one unit."""

    def block_classes(self) -> set[type[nn.Module]]: ...


@runtime_checkable
class ChecksObsSpace(Protocol):
    """A policy that checks the env's observation space itself (raises ``ValueError`` naming the flag
    to change); ``VLAModule.check_env_spec`` calls it before any sampler starts."""

    def check_obs_space(self, space: object) -> None: ...
