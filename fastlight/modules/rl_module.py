"""``RLModule``: PPO-family training on Rollouts with masked GAE and the SMPO loss.

Manual optimisation: each Rollout is one training step of ``update_epochs`` x ``num_minibatches``
minibatches over the valid transitions; every loss term is SMPO-reduced (FAST §SMPO), the count
all-reduced under DDP so the global mean is exact.

The policy is injected (``--model.policy``) or built by :meth:`build_policy` in ``configure_model``.
Subclass hooks, in the order a step uses them: :meth:`build_policy`, :meth:`compute_advantages`,
:meth:`evaluate_actions`, :meth:`compute_loss` (returns ``(loss, info)``), :meth:`param_groups`.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor, nn
from typing_extensions import override

from fastlight.advantages import (
    chunk_rewards,
    group_relative_advantages,
    group_step_advantages,
    masked_gae,
    normalize_advantages,
)
from fastlight.data.protocols import GroupsEnvs, ReportsFaults
from fastlight.losses import entropy_bonus, explained_variance, value_loss
from fastlight.losses.ratios import Granularity
from fastlight.models.action_mapping import action_chunk
from fastlight.models.base import EvalOutput, Policy, PolicyBase
from fastlight.models.mlp import MLPActorCritic
from fastlight.models.multi_input import MultiInputActorCritic
from fastlight.models.normalization import NormalizedPolicy
from fastlight.modules.checkpointing import save_hparams
from fastlight.modules.checks import check_mlp_sizes, check_settings, check_spaces
from fastlight.modules.logp_mismatch import LogpMismatch, on_current_weights
from fastlight.modules.minibatch import Minibatch, recompute_values
from fastlight.modules.nonfinite import NonfiniteSteps
from fastlight.modules.objectives import Objective, PPOClip, as_objective
from fastlight.modules.policy_module import PolicyModule
from fastlight.modules.rollout_logging import rollout_metrics
from fastlight.rollout import Rollout

#: ``--model.advantage``'s values (:mod:`fastlight.advantages`).
ADVANTAGES = ("gae", "grpo", "group_steps")


class RLModule(PolicyModule):
    """PPO / GIPO / SAPO on Rollouts.

    Args:
        obs_dim: the env's flat observation size, 0 for a dict (linked from --data).
        action_dim: Box dims, Discrete choices or Multi* entries (linked from --data).
        continuous: continuous actions (linked from --data).
        spaces: the env's spaces (linked from --data).
        policy: the actor-critic (:class:`fastlight.models.base.Policy`); ``None``: :meth:`build_policy`.
        hidden_sizes: MLP widths of the default policy (refused together with ``policy``).
        lr: Adam learning rate.
        gamma: discount factor per env step (an action chunk of ``h`` env steps: ``gamma**h``).
        gae_lambda: GAE lambda (0: one-step TD advantages, 1: Monte-Carlo returns).
        update_epochs: K, the epochs over each rollout (K x M optimizer steps per rollout).
        num_minibatches: M, the minibatches each epoch splits the rollout's valid transitions into.
        objective: policy objective: ``PPOClip`` (``None``), ``GIPO`` (AcceRL §GIPO), ``SAPO``, or your own.
        ratio_granularity: ``token | action | chunk`` importance ratios (:mod:`fastlight.losses.ratios`).
        tokens_per_action: consecutive tokens per ratio for ``action`` granularity; ``None``: one action's.
        vf_coef: weight of the value loss.
        ent_coef: weight of the entropy bonus.
        value_clip_eps: PPO2-style value clipping range, ``None`` for the unclipped loss.
        max_grad_norm: gradient clipping by global norm (``None`` disables).
        normalize_advantages: standardise advantages over valid steps (globally under DDP).
        advantage: ``gae``, or a clip's (``grpo``) or step's (``group_steps``) return against its group's.
        normalize_obs: normalise observations by running statistics; ``None``: for continuous flat control.
        normalize_returns: the critic predicts values in running-std units of the targets; ``None``: as above.
        recompute_values: re-run the current critic before GAE (AcceRL §value recomputation).
        init_from: a checkpoint whose policy weights this run starts from (``--ckpt_path`` resumes instead).
        value_warmup_updates: for this many first updates only the critic learns.
        max_nonfinite_updates: this many skipped NaN / inf optimizer steps in a row stop the run; ``0``: off.
    """

    def __init__(
        self,
        obs_dim: int = 0,
        action_dim: int = 0,
        continuous: bool = False,
        spaces: dict | None = None,
        # Typed for the CLI, whose help then lists fastlight's policies (nn.Module would list torch.nn).
        policy: PolicyBase | Policy | None = None,
        hidden_sizes: tuple[int, ...] = (64, 64),
        lr: float = 3e-4,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        update_epochs: int = 4,
        num_minibatches: int = 4,
        objective: Objective | None = None,
        ratio_granularity: Granularity = "token",
        tokens_per_action: int | None = None,
        vf_coef: float = 0.5,
        ent_coef: float = 0.01,
        value_clip_eps: float | None = None,
        max_grad_norm: float | None = 0.5,
        normalize_advantages: bool = True,
        advantage: Literal["gae", "grpo", "group_steps"] = "gae",
        normalize_obs: bool | None = None,
        normalize_returns: bool | None = None,
        recompute_values: bool = False,
        init_from: str | None = None,
        value_warmup_updates: int = 0,
        max_nonfinite_updates: int = 3,
    ) -> None:
        super().__init__()
        check_settings(locals(), default_policy=type(self).build_policy is RLModule.build_policy)
        if advantage not in ADVANTAGES:
            raise ValueError(f"--model.advantage must be one of {' | '.join(ADVANTAGES)}, got {advantage!r}")
        #: The policy objective compute_loss uses (hparams hold its class_path / init_args).
        self.objective = as_objective(objective, default=self.default_objective)
        self._informative_groups: Tensor | None = None  # a group advantage's, per update
        save_hparams(self, policy, self.objective, frame=inspect.currentframe())
        self.automatic_optimization = False
        if policy is not None:
            self.policy = policy
        # Updates so far, tagging the weights the samplers act with (a buffer: a resume keeps counting).
        self.register_buffer("_policy_version", torch.zeros((), dtype=torch.long))
        #: Skips optimizer steps with a NaN / inf loss or gradient (``--model.max_nonfinite_updates``).
        self.nonfinite = NonfiniteSteps(max_nonfinite_updates)
        #: ``rollout/logp_mismatch_*``: samplers' vs learner's log-likelihoods before each update.
        self.mismatch = LogpMismatch()

    #: The objective ``objective=None`` means (a subclass may choose another, e.g. VLAModule GIPO).
    default_objective: type[Objective] = PPOClip

    # ------------------------------------------------------------------ hooks for subclasses
    def build_policy(self) -> nn.Module:
        """The actor-critic when none is injected; runs once, in ``configure_model`` (after ``__init__``)."""
        h = self.hparams
        if h.get("spaces"):
            check_spaces(h.spaces)
            return MultiInputActorCritic(h.spaces, hidden_sizes=tuple(h.hidden_sizes))
        check_mlp_sizes(h.obs_dim, h.action_dim)
        return MLPActorCritic(
            h.obs_dim, h.action_dim, continuous=h.continuous, hidden_sizes=tuple(h.hidden_sizes)
        )

    def compute_advantages(self, rollout: Rollout) -> tuple[Tensor, Tensor, Tensor]:
        """Masked GAE over ``[T, E]``; returns (advantages, returns, values used)."""
        h = self.hparams
        values = recompute_values(self.policy, rollout) if h.recompute_values else rollout.values
        rewards, discounts = rollout.rewards, None
        if rollout.chunked:  # action chunks: semi-MDP steps of h env steps, discounted by gamma^h
            rewards, discounts = chunk_rewards(rollout.step_rewards, rollout.env_steps, h.gamma)
        ends = {"terminated": rollout.terminated, "truncated": rollout.truncated, "valid": rollout.valid}
        adv, ret = masked_gae(
            rewards=rewards,
            values=values,
            bootstrap_values=rollout.bootstrap_values,
            gamma=h.gamma,
            lam=h.gae_lambda,
            discounts=discounts,
            **ends,
        )
        kind = h.get("advantage", "gae")
        if kind != "gae":
            size = self._group_size()
            if kind == "grpo":
                adv = group_relative_advantages(rewards=rollout.rewards, group_size=size, **ends)
            else:
                adv = group_step_advantages(rewards=rewards, group_size=size, gamma=h.gamma, **ends)
            # The groups whose clips earned different returns: the only ones that move the policy.
            self._informative_groups = (adv != 0).any(0).view(-1, size).any(1).float().mean()
        if h.normalize_advantages and kind != "grpo":
            # One all-reduce of (sum, sum of squares, count) under DDP (AcceRL §global normalisation).
            adv = normalize_advantages(adv, rollout.valid)
        if isinstance(self.policy, NormalizedPolicy):  # the critic's units, before it learns them
            self.policy.update_returns(ret, rollout.valid, reduce=self.sum_over_ranks)
        return adv, ret, values

    def _group_size(self) -> int:
        """``--model.advantage grpo | group_steps``'s group size (:mod:`fastlight.advantages`)."""
        data = self._trainer.datamodule if self._trainer is not None else None
        size = data.group_size if isinstance(data, GroupsEnvs) else 1
        if size < 2:
            raise ValueError(
                f"--model.advantage {self.hparams.advantage} compares clips that started alike: set "
                f"--data.group_size to 2 or more (a divisor of each sampler's envs), got {size}"
            )
        return size

    def evaluate_actions(self, mb: Minibatch) -> EvalOutput:
        return self.policy.evaluate(mb.obs, mb.actions, step=mb.step)

    def compute_loss(
        self, mb: Minibatch, out: EvalOutput, count: Tensor | None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Objective + ``vf_coef`` x value loss - ``ent_coef`` x entropy, all SMPO-reduced."""
        h = self.hparams
        pg, info = self.objective.loss(
            logprobs=out.logprobs,
            old_logprobs=mb.logprobs,
            advantages=mb.advantages,
            valid=mb.valid,
            granularity=h.ratio_granularity,
            tokens_per_action=self.tokens_per_action(out.logprobs),
            count=count,
        )
        # With return normalisation, the value error in units of the targets' std.
        scale = self.policy.value_scale.to(out.values) if isinstance(self.policy, NormalizedPolicy) else 1.0
        vl = value_loss(
            values=out.values / scale,
            returns=mb.returns / scale,
            valid=mb.valid,
            old_values=mb.values / scale,
            clip_eps=h.value_clip_eps,
            count=count,
        )
        ent = entropy_bonus(entropy=out.entropy, valid=mb.valid, count=count)
        if self.policy_version < h.get("value_warmup_updates", 0):
            loss = h.vf_coef * vl  # critic warm-up: the policy stays where init_from put it
            if self._trainer is not None and self.trainer.world_size > 1:
                # DDP refuses a parameter outside the loss's graph: the policy terms enter with weight 0.
                loss = loss + 0.0 * (pg - h.ent_coef * ent)
        else:
            loss = pg + h.vf_coef * vl - h.ent_coef * ent
        terms = {"policy": pg, "value": vl, "entropy": ent, "total": loss}
        return loss, {**info, **{k: v.detach() for k, v in terms.items()}}

    def tokens_per_action(self, logprobs: Tensor) -> int:
        """``--model.tokens_per_action``, or (``None``) ``K`` of ``logprobs [N, K]`` over the action chunk."""
        tpa = self.hparams.get("tokens_per_action")
        if tpa is not None:
            return int(tpa)
        if logprobs.dim() < 2:
            return 1
        k, chunk = logprobs.shape[-1], action_chunk(self.policy.action_mapping()) or 1
        if k % chunk:
            raise ValueError(
                f"the policy's {k} action tokens do not split into its action_chunk {chunk}: "
                f"set --model.tokens_per_action"
            )
        return k // chunk

    def param_groups(self) -> list[dict[str, Any]]:
        return [{"params": [p for p in self.policy.parameters() if p.requires_grad]}]

    # ------------------------------------------------------------------ Lightning
    @property
    def policy_version(self) -> int:
        return int(self._policy_version)

    @property
    def optimizer_steps_per_update(self) -> int:
        """Optimizer steps in one training step (what ``--trainer.max_steps`` counts)."""
        return self.hparams.update_epochs * self.hparams.num_minibatches

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        groups = self.param_groups()
        # Fused Adam (one kernel for every tensor) on plain CPU / CUDA tensors only (not sharded DTensors).
        params = [p for g in groups for p in g["params"]]
        fused = bool(params) and all(
            type(p.data) is torch.Tensor and p.device.type in ("cpu", "cuda") and p.is_floating_point()
            for p in params
        )
        # Lightning refuses to clip a fused optimizer's gradients under mixed precision.
        fused = fused and not (self._trainer is not None and "mixed" in str(self.trainer.precision))
        return torch.optim.Adam(groups, lr=self.hparams.lr, eps=1e-5, fused=fused or None)

    @override
    def training_step(self, batch: Rollout, batch_idx: int) -> None:
        if not isinstance(batch, Rollout):
            raise TypeError(f"RLModule.training_step expects a Rollout, got {type(batch).__name__}")
        rollout = batch
        with torch.no_grad():
            adv, ret, values = self.compute_advantages(rollout)
        infos = self._update(rollout, adv, ret, values)
        if isinstance(self.policy, NormalizedPolicy):  # after the update: the next version carries them
            self.policy.update_obs(rollout.obs, rollout.valid, reduce=self.sum_over_ranks)
        self._policy_version += 1
        self._log_step(rollout, infos, values, ret)

    def _update(self, rollout: Rollout, adv: Tensor, ret: Tensor, values: Tensor) -> dict[str, Tensor]:
        h = self.hparams
        opt = self.optimizers()
        opt = opt[0] if isinstance(opt, list) else opt  # the RL optimizer first (a subclass may add more)
        # FAST §SMPO: minibatches are drawn from the valid transitions only.
        idx = rollout.valid.reshape(-1).nonzero().squeeze(-1)
        data = Minibatch.from_rollout(rollout, adv, ret, values)
        infos: list[dict[str, Tensor]] = []
        # Never an empty minibatch; a rollout with no valid transition is not an update.
        pieces = min(h.num_minibatches, idx.numel())
        fresh = on_current_weights(rollout.policy_version, rollout.valid, self.policy_version)
        for epoch in range(h.update_epochs if pieces else 0):
            perm = idx[torch.randperm(idx.numel(), device=idx.device)]
            for minibatch, mb_idx in enumerate(torch.tensor_split(perm, pieces)):
                mb = data.select(mb_idx)
                count = self._global_count(mb.valid)
                out = self.evaluate_actions(mb)
                if epoch == 0 and minibatch == 0:  # before any optimizer step of this update
                    self.mismatch.measure(learner=out.logprobs, behaviour=mb.logprobs, fresh=fresh)
                loss, info = self.compute_loss(mb, out, count)
                opt.zero_grad(set_to_none=True)
                self.manual_backward(loss)
                if h.max_grad_norm is not None:
                    self.clip_gradients(opt, h.max_grad_norm, gradient_clip_algorithm="norm")
                self._skip_if_nonfinite(opt, loss, epoch, minibatch)
                opt.step()  # with every grad None (a skipped step) the optimizer changes nothing
                infos.append(info)
        if not infos:  # one stack + mean at the end: no host sync inside the minibatch loop
            return {}
        return {k: torch.stack([i[k] for i in infos]).mean() for k in infos[0]}

    def _skip_if_nonfinite(self, opt: Any, loss: Tensor, epoch: int, minibatch: int) -> None:
        """Drop this step's gradients if the loss or a gradient is NaN / inf (:class:`NonfiniteSteps`)."""
        at = (self.global_step, self.policy_version, epoch, minibatch)
        world_size = self._trainer.world_size if self._trainer is not None else 1  # 1: no Trainer
        self.nonfinite.check(opt, loss, self.policy.parameters(), world_size=world_size, at=at)

    @property
    def skipped_updates(self) -> int:
        """Optimizer steps skipped for a non-finite loss or gradient (``faults/skipped_updates``)."""
        return self.nonfinite.skipped

    def _global_count(self, valid: Tensor) -> Tensor | None:
        """SMPO denominator under DDP: the all-reduced valid count / world size; ``None`` in one process."""
        if not (dist.is_available() and dist.is_initialized()) or self.trainer.world_size == 1:
            return None
        n = valid.sum().to(torch.float32)
        dist.all_reduce(n)
        return n / self.trainer.world_size

    def _log_step(self, rollout: Rollout, infos: dict[str, Tensor], values: Tensor, ret: Tensor) -> None:
        ev = explained_variance(values=values, returns=ret, valid=rollout.valid)
        metrics = {f"loss/{k}": v for k, v in infos.items()}
        metrics["loss/explained_variance"] = ev
        metrics["faults/skipped_updates"] = torch.tensor(float(self.skipped_updates))
        datamodule = self._trainer.datamodule if self._trainer is not None else None
        if isinstance(datamodule, ReportsFaults):
            metrics.update({k: torch.tensor(v) for k, v in datamodule.fault_counters().items()})
        metrics.update(rollout_metrics(rollout, current_version=self.policy_version - 1))
        metrics.update(self.mismatch.metrics())
        if self._informative_groups is not None:
            metrics["loss/grpo_informative_groups"] = self._informative_groups
        n = max(rollout.num_valid, 1)
        shown = {k: metrics.pop(k) for k in ("rollout/return",) if k in metrics}
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=n)
        self.log_dict(shown, on_step=True, on_epoch=False, batch_size=n, prog_bar=True)
