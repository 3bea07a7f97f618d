"""``RLModule``: PPO-family training on Rollouts with masked GAE and the SMPO loss.

Manual optimisation: each Rollout is one Lightning training step, inside which the module runs
``update_epochs`` epochs x ``num_minibatches`` minibatches over the valid transitions. Every
loss term is a masked sum over valid transitions divided by their count (FAST §SMPO), and under
DDP the count is all-reduced so the global mean is exact.

The policy is either injected (``policy=``; from the CLI, ``--model.policy`` with ``class_path`` /
``init_args``) or built by :meth:`build_policy` in Lightning's ``configure_model`` hook, i.e. after
``__init__``: a subclass sets its own attributes after ``super().__init__(**kwargs)`` and its
``build_policy`` reads them. Until then ``module.policy`` raises an ``AttributeError`` saying so.

Subclass hooks, in the order a step uses them:

- :meth:`build_policy` - the actor-critic when none is injected (default :class:`MLPActorCritic`);
- :meth:`compute_advantages` - masked GAE (+ value recomputation, normalisation);
- :meth:`evaluate_actions` - log-probs, entropy, values of a minibatch;
- :meth:`compute_loss` - objective + value + entropy terms, returns ``(loss, info)``;
- :meth:`param_groups` - optimizer parameter groups (e.g. a value-head learning rate).
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from typing_extensions import override

from fastlight.advantages import chunk_rewards, masked_gae, normalize_advantages
from fastlight.class_paths import class_path, same_class
from fastlight.data.protocols import ReportsFaults
from fastlight.losses import entropy_bonus, explained_variance, value_loss
from fastlight.losses.ratios import GRANULARITIES, Granularity
from fastlight.models.action_mapping import action_chunk
from fastlight.models.base import EvalOutput, Policy, PolicyBase
from fastlight.models.mlp import MLPActorCritic
from fastlight.models.normalization import NormalizedPolicy, resolve_normalization, with_normalization
from fastlight.modules.init_from import load_policy_weights
from fastlight.modules.minibatch import Minibatch, recompute_values
from fastlight.modules.objective_hparams import as_objective, legacy_load_kwargs
from fastlight.modules.objectives import Objective, PPOClip
from fastlight.modules.rollout_logging import rollout_metrics
from fastlight.modules.weights_fit import first_misfit, setting_differences
from fastlight.rollout import Rollout


class RLModule(L.LightningModule):
    """PPO / GIPO / SAPO on Rollouts.

    Args:
        obs_dim: the env's flattened observation size, 0 for dict observations (linked from the
            DataModule by the CLI).
        action_dim: the env's action size: a Box action's dimensions, or a Discrete action's choices
            (linked from the DataModule by the CLI).
        continuous: whether the env's actions are continuous (linked from the DataModule by the CLI).
        policy: the actor-critic, any ``nn.Module`` implementing :class:`fastlight.models.base.Policy`
            (CLI: ``--model.policy.class_path`` / ``init_args``: a :class:`~fastlight.models.base.PolicyBase`
            subclass, or a class whose methods have the protocol's signatures). ``None``:
            :meth:`build_policy` builds one in ``configure_model`` (default: :class:`MLPActorCritic`
            from the env's sizes).
        hidden_sizes: MLP widths of the default policy (refused together with ``policy``).
        lr: Adam learning rate.
        gamma: discount factor of the returns, per env step (a transition that executed an action
            chunk of ``h`` env steps is discounted by ``gamma**h``, see :mod:`fastlight.advantages`).
        gae_lambda: GAE lambda (0: one-step TD advantages, 1: Monte-Carlo returns).
        update_epochs: K, the epochs over each rollout (K x M optimizer steps per rollout).
        num_minibatches: M, the minibatches each epoch splits the rollout's valid transitions into.
        objective: the policy objective, an :class:`~fastlight.modules.objectives.Objective` holding
            its own settings (CLI: ``--model.objective GIPO --model.objective.sigma 0.2``; YAML
            ``class_path`` / ``init_args``): :class:`~fastlight.modules.objectives.PPOClip` (the
            default, ``None``), ``GIPO`` (AcceRL §GIPO), ``SAPO`` or a subclass of your own.
        ratio_granularity: ``token | action | chunk`` importance ratios (token policies), for
            every objective (:mod:`fastlight.losses.ratios`).
        tokens_per_action: consecutive tokens per ratio for ``action`` granularity. ``None`` (the
            default): the tokens of one env action, ``K / H`` of a policy's ``K`` tokens per call in
            chunks of ``H`` env actions (``action_dim`` for a :class:`~fastlight.vla.policy.VLAPolicy`),
            so ``action`` is one ratio per env action, ``chunk`` one per policy call.
        vf_coef: weight of the value loss.
        ent_coef: weight of the entropy bonus.
        value_clip_eps: PPO2-style value clipping range, ``None`` for the unclipped loss.
        max_grad_norm: gradient clipping by global norm (``None`` disables).
        normalize_advantages: standardise advantages over valid steps (globally under DDP).
        normalize_obs: keep running observation statistics in the policy and act on normalised
            observations (:class:`~fastlight.models.normalization.NormalizedPolicy`: updated from each
            Rollout's valid steps, published with the weights, saved in checkpoints). ``None``
            (default): on for continuous actions over flat vector observations (MuJoCo-style
            control, where every PPO library normalises), off otherwise (highway-env's features are
            normalised already; images and tokens are not vectors).
        normalize_returns: the critic predicts values in units of the running mean/std of the value
            targets, so the value loss has unit scale whatever the reward scale (Sample Factory's
            ``normalize_returns``). ``None`` (default): as ``normalize_obs``.
        recompute_values: re-run the current critic before GAE (AcceRL §value recomputation).
        init_from: a checkpoint whose policy weights this run starts from (e.g. an SFT run's
            ``last.ckpt``; see :mod:`fastlight.modules.init_from`). ``--ckpt_path`` resumes instead.
        value_warmup_updates: for this many first updates only the critic learns (the policy and
            entropy terms are off), so a critic fresh on top of a fine-tuned policy does not steer
            it with noise.
        max_nonfinite_updates: an optimizer step whose loss or gradient is NaN / inf is skipped (the
            weights and the optimizer state stay as they were) and counted as
            ``faults/skipped_updates``; this many skipped in a row stop the run, naming loss or
            gradient and the step. ``0`` turns the check off.
    """

    def __init__(
        self,
        obs_dim: int = 0,
        action_dim: int = 0,
        continuous: bool = False,
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
        normalize_obs: bool | None = None,
        normalize_returns: bool | None = None,
        recompute_values: bool = False,
        init_from: str | None = None,
        value_warmup_updates: int = 0,
        max_nonfinite_updates: int = 3,
    ) -> None:
        super().__init__()
        _validate(locals())
        if policy is None and type(self).build_policy is RLModule.build_policy:
            _check_mlp_sizes(obs_dim, action_dim)  # refuse now rather than when fit starts
        #: The policy objective compute_loss uses (hparams hold its class_path / init_args).
        self.objective = as_objective(objective, default=self.default_objective)
        self._save_hparams_without_policy_object(policy)
        if "_instantiator" not in self.hparams:  # built from Python: hparams hold plain data, as the CLI's
            self._record_policy_hparams({"objective": self.objective.config()})
        self.automatic_optimization = False
        if policy is not None:
            self.policy = policy
        # Number of updates so far; tags the weights the samplers act with. A buffer, so it is
        # saved in checkpoints and a resumed run keeps counting.
        self.register_buffer("_policy_version", torch.zeros((), dtype=torch.long))
        self._initialised_from = False
        self.skipped_updates = 0  # optimizer steps skipped for a non-finite loss or gradient
        self._nonfinite_in_a_row = 0

    policy: nn.Module  # set by __init__ (injected) or configure_model (build_policy)
    #: The objective ``objective=None`` means (a subclass may choose another, e.g. VLAModule GIPO).
    default_objective: type[Objective] = PPOClip

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Lightning's, plus checkpoints saved before objectives were objects (``objective: gipo``,
        ``gipo_sigma`` ...): they load with the objective they trained with
        (:func:`~fastlight.modules.objective_hparams.legacy_load_kwargs`)."""
        kwargs = {**kwargs, **legacy_load_kwargs(checkpoint_path, kwargs)}
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def _save_hparams_without_policy_object(self, policy: nn.Module | None) -> None:
        """``save_hyperparameters`` of the whole ``__init__`` chain, minus a policy *object*.

        Built by LightningCLI (hparams carry its ``_instantiator``), the hparams hold ``policy`` as
        the CLI config's ``class_path`` / ``init_args``, which ``load_from_checkpoint`` rebuilds. A
        policy passed as a Python object is neither copied nor pickled into every checkpoint: only
        its class path is kept, and loading asks for the object again.
        """
        frame = inspect.currentframe().f_back  # RLModule.__init__
        self.save_hyperparameters(ignore=["policy"], frame=frame)
        if "_instantiator" in self.hparams:
            self.save_hyperparameters(frame=frame)  # the CLI's config: policy is plain data there
        else:
            self._record_policy_hparams({"policy": None if policy is None else class_path(type(policy))})

    def _record_policy_hparams(self, values: dict[str, Any]) -> None:
        self._hparams.update(values)
        self._hparams_initial.update(copy.deepcopy(values))  # what loggers record

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Rebuilt from a CLI checkpoint, keep its policy config (not just the class path), so that
        a checkpoint saved from this module rebuilds the policy too. Weights that cannot be loaded
        into this module are refused first, naming the settings that differ (:meth:`_check_weights_fit`)."""
        self._check_weights_fit(checkpoint)
        saved = checkpoint.get(self.CHECKPOINT_HYPER_PARAMS_KEY) or {}
        config = saved.get("policy")
        if isinstance(config, dict) and same_class(self.hparams.get("policy"), config.get("class_path")):
            values = {"policy": config}
            if same_class(saved.get("_class_path"), class_path(type(self))) and "_instantiator" in saved:
                values.update(_class_path=saved["_class_path"], _instantiator=saved["_instantiator"])
            self._record_policy_hparams(values)
        self._use_typed_learning_rates(checkpoint)

    def _check_weights_fit(self, checkpoint: dict[str, Any]) -> None:
        """Refuse, in one line, a checkpoint whose weights this module cannot load (resuming with
        another ``--model.hidden_sizes``, another env): the settings that differ from the checkpoint's
        and the first tensor that does not fit, where ``load_state_dict`` would list every tensor in a
        long ``size mismatch`` traceback. Runs before anything is loaded (and before any sampler starts).

        Not checked under a strategy that restores after wrapping the model (FSDP, DeepSpeed): its
        module holds shards here, and it loads the checkpoint its own way.
        """
        theirs = checkpoint.get("state_dict")
        trainer = self._trainer
        if not isinstance(theirs, dict) or not theirs or "policy" not in self._modules:
            return  # no weights to load (a hook called on its own), or no policy to load them into
        if trainer is not None and trainer.strategy.restore_checkpoint_after_setup:
            return
        misfit = first_misfit(self.state_dict(), theirs, strict=self.strict_loading)
        if misfit is None:
            return
        datamodule = trainer.datamodule if trainer is not None else None
        diffs = setting_differences(
            checkpoint.get(self.CHECKPOINT_HYPER_PARAMS_KEY) or {},
            dict(self.hparams),
            checkpoint.get("datamodule_hyper_parameters") or {},
            dict(getattr(datamodule, "hparams", None) or {}),
        )
        path = trainer.ckpt_path if trainer is not None else None
        where = f"--ckpt_path {path}: " if path else ""
        if diffs:
            why = f"{'; '.join(diffs)}: the checkpoint's weights cannot be loaded into this model"
        else:  # same settings, other shapes: the class itself (or its code) changed
            why = (
                f"the checkpoint's weights cannot be loaded into this model (--model.class_path "
                f"{class_path(type(self))}, with the checkpoint's settings)"
            )
        raise ValueError(
            f"{where}{why} ({misfit}); resume with the checkpoint's settings, or start a new run without "
            "--ckpt_path"
        )

    def _use_typed_learning_rates(self, checkpoint: dict[str, Any]) -> None:
        """Resuming with a changed ``lr`` (or ``*_lr``) means the new one: the optimizer state
        restored from the checkpoint would otherwise bring back the old rates silently. Edits the
        checkpoint's optimizer param groups, restored after this hook, to this module's rates."""
        saved = checkpoint.get(self.CHECKPOINT_HYPER_PARAMS_KEY) or {}
        rates = [k for k in self.hparams if k == "lr" or k.endswith("_lr")]
        changed = [k for k in rates if k in saved and saved[k] != self.hparams[k]]
        states = checkpoint.get("optimizer_states")
        if not changed or not states or "policy" not in self._modules:
            return
        fresh = self.configure_optimizers()
        opts = list(fresh) if isinstance(fresh, (list, tuple)) else [fresh]
        if len(opts) != len(states) or not all(isinstance(o, torch.optim.Optimizer) for o in opts):
            return
        for opt, state in zip(opts, states, strict=True):
            for group, saved_group in zip(opt.param_groups, state["param_groups"], strict=False):
                saved_group["lr"] = group["lr"]

    def __getattr__(self, name: str) -> Any:
        if name == "policy" and "policy" not in self.__dict__.get("_modules", {}):
            raise AttributeError(
                f"{type(self).__name__}.policy does not exist yet: it is built by configure_model(), "
                "which the Trainer calls at the start of fit/validate/predict (and load_from_checkpoint "
                "calls too), after __init__; use the policy in configure_model() after "
                "super().configure_model(), outside a Trainer call module.configure_model() first, or "
                "inject one (--model.policy, or policy=...)"
            )
        return super().__getattr__(name)

    @override
    def configure_model(self) -> None:
        """Build the policy with :meth:`build_policy` unless it exists (injected, or built before).

        Lightning calls this inside the strategy's init context (device, sharding, precision), after
        ``setup`` and before a checkpoint is restored. Idempotent: it may run more than once.
        """
        if "policy" not in self._modules:
            try:
                policy = self.build_policy()
            except AttributeError as e:  # e.g. an attribute the subclass never set: say where to set it
                raise TypeError(_build_policy_hint(self, e)) from e
            self.policy = policy
        # Only under a Trainer: a module rebuilt by load_from_checkpoint gets its weights from there.
        if self.hparams.get("init_from") and self._trainer is not None and not self._initialised_from:
            info = load_policy_weights(self.core_policy, self.hparams.init_from)
            self._initialised_from = True
            rank_zero_info(
                f"fastlight: policy initialised from {self.hparams.init_from} ({info['tensors']} tensors"
                + ("" if info["value_loaded"] else "; value head left at its initialisation")
                + ")"
            )
        norm_obs, norm_ret = self.normalization()
        wrapped = with_normalization(
            self.policy, obs_dim=self.hparams.obs_dim, normalize_obs=norm_obs, normalize_returns=norm_ret
        )
        if wrapped is not self.policy:
            self.policy = wrapped

    def normalization(self) -> tuple[bool, bool]:
        """Whether observations and returns are normalised (``None`` settings resolved: on for
        continuous actions over flat vector observations)."""
        h = self.hparams
        return resolve_normalization(
            continuous=bool(h.get("continuous")),
            obs_dim=int(h.get("obs_dim") or 0),
            normalize_obs=h.get("normalize_obs"),
            normalize_returns=h.get("normalize_returns"),
        )

    @property
    def core_policy(self) -> nn.Module:
        """The actor-critic itself, inside the normalisation wrapper when there is one."""
        policy = self.policy
        return policy.policy if isinstance(policy, NormalizedPolicy) else policy

    # ------------------------------------------------------------------ hooks for subclasses
    def build_policy(self) -> nn.Module:
        """The actor-critic when none is injected; runs once, in ``configure_model``.

        Reads ``self.hparams`` and any attribute a subclass set in its ``__init__`` (they all exist
        by now). Override for a new observation / action type.
        """
        h = self.hparams
        _check_mlp_sizes(h.obs_dim, h.action_dim)
        return MLPActorCritic(
            h.obs_dim, h.action_dim, continuous=h.continuous, hidden_sizes=tuple(h.hidden_sizes)
        )

    def policy_flag(self, name: str) -> str:
        """The CLI flag that sets the policy's ``name``: ``--model.policy.init_args.<name>`` for an
        injected policy, else ``--model.<name>`` (the default policy is built from those)."""
        injected = self.hparams.get("policy") is not None
        return f"--model.policy.init_args.{name}" if injected else f"--model.{name}"

    def check_env_spec(self, spec: Any) -> None:
        """Refuse a policy whose sizes do not match the env (called by the DataModule before it
        starts the samplers, after ``configure_model``)."""
        mine = {k: getattr(self.core_policy, k, None) for k in ("obs_dim", "action_dim", "continuous")}
        theirs = {"obs_dim": spec.obs_dim, "action_dim": spec.action_dim, "continuous": spec.continuous}
        for key, value in mine.items():
            if value is not None and value != theirs[key]:
                raise ValueError(
                    f"{self.policy_flag(key)}={value} does not match the env's {key}={theirs[key]} "
                    f"(observation/action space of --data.env_id)"
                )

    def compute_advantages(self, rollout: Rollout) -> tuple[Tensor, Tensor, Tensor]:
        """Masked GAE over ``[T, E]``; returns (advantages, returns, values used)."""
        h = self.hparams
        values = recompute_values(self.policy, rollout) if h.recompute_values else rollout.values
        rewards, discounts = rollout.rewards, None
        if rollout.chunked:  # action chunks: semi-MDP steps of h env steps, discounted by gamma^h
            rewards, discounts = chunk_rewards(rollout.step_rewards, rollout.env_steps, h.gamma)
        adv, ret = masked_gae(
            rewards=rewards,
            values=values,
            bootstrap_values=rollout.bootstrap_values,
            terminated=rollout.terminated,
            truncated=rollout.truncated,
            valid=rollout.valid,
            gamma=h.gamma,
            lam=h.gae_lambda,
            discounts=discounts,
        )
        if h.normalize_advantages:
            # One all-reduce of (sum, sum of squares, count) under DDP (AcceRL §global normalisation).
            adv = normalize_advantages(adv, rollout.valid)
        if isinstance(self.policy, NormalizedPolicy):
            # This update's value targets set the critic's units before it learns them (Sample
            # Factory's order); GAE above used the values in return units as sampled.
            self.policy.update_returns(ret, rollout.valid, reduce=self._sum_over_ranks)
        return adv, ret, values

    def _sum_over_ranks(self, x: Tensor) -> Tensor:
        """A statistic summed over the DDP ranks (identity on one process): every rank then holds the
        same normalisation statistics."""
        trainer = self._trainer
        if trainer is None or trainer.world_size <= 1:
            return x
        return trainer.strategy.reduce(x, reduce_op="sum")

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
        # With return normalisation, the value error in units of the targets' std (= the loss of a
        # critic predicting normalised values): unit scale whatever the reward scale.
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
                # DDP all-reduces the gradient of every parameter and refuses one outside the loss's
                # graph: the policy terms enter with weight 0 (zero gradients, so Adam leaves the policy
                # where it is; its step count advances). One process keeps them out of the graph.
                loss = loss + 0.0 * (pg - h.ent_coef * ent)
        else:
            loss = pg + h.vf_coef * vl - h.ent_coef * ent
        info = {
            **info,
            "policy": pg.detach(),
            "value": vl.detach(),
            "entropy": ent.detach(),
            "total": loss.detach(),
        }
        return loss, info

    def tokens_per_action(self, logprobs: Tensor) -> int:
        """``--model.tokens_per_action``, or (``None``) the tokens of one env action: the ``K``
        tokens of ``logprobs [N, K]`` over the policy's action chunk (1 for ``[N]`` log-probs)."""
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
        return torch.optim.Adam(self.param_groups(), lr=self.hparams.lr, eps=1e-5)

    @override
    def training_step(self, batch: Rollout, batch_idx: int) -> None:
        if not isinstance(batch, Rollout):
            raise TypeError(f"RLModule.training_step expects a Rollout, got {type(batch).__name__}")
        rollout = batch
        with torch.no_grad():
            adv, ret, values = self.compute_advantages(rollout)
        infos = self._update(rollout, adv, ret, values)
        if isinstance(self.policy, NormalizedPolicy):
            # After the update: this Rollout was sampled, and its update evaluated, with the
            # statistics published before it; the next version carries the new ones.
            self.policy.update_obs(rollout.obs, rollout.valid, reduce=self._sum_over_ranks)
        self._policy_version += 1
        self._log_step(rollout, infos, values, ret)

    def _update(self, rollout: Rollout, adv: Tensor, ret: Tensor, values: Tensor) -> dict[str, Tensor]:
        h = self.hparams
        opt = self.optimizers()
        opt = opt[0] if isinstance(opt, list) else opt  # the RL optimizer first (a subclass may add more)
        flat_valid = rollout.valid.reshape(-1)
        idx = flat_valid.nonzero().squeeze(-1)  # minibatches hold valid transitions only
        data = Minibatch.from_rollout(rollout, adv, ret, values)
        infos: list[dict[str, Tensor]] = []
        # A rollout with fewer valid transitions than minibatches (DPSA cycles vary) splits into
        # as many as it has, never into empty ones; one with none is not an update.
        pieces = min(h.num_minibatches, idx.numel())
        for epoch in range(h.update_epochs if pieces else 0):
            perm = idx[torch.randperm(idx.numel(), device=idx.device)]
            for minibatch, mb_idx in enumerate(torch.tensor_split(perm, pieces)):
                mb = data.select(mb_idx)
                count = self._global_count(mb.valid)
                out = self.evaluate_actions(mb)
                loss, info = self.compute_loss(mb, out, count)
                opt.zero_grad(set_to_none=True)
                self.manual_backward(loss)
                if h.max_grad_norm is not None:
                    self.clip_gradients(
                        opt, gradient_clip_val=h.max_grad_norm, gradient_clip_algorithm="norm"
                    )
                if h.get("max_nonfinite_updates", 3):
                    self._skip_if_nonfinite(opt, loss, epoch, minibatch)
                opt.step()  # with every grad None (a skipped step) the optimizer changes nothing
                infos.append(info)
        # One stack + mean at the end: no host sync inside the minibatch loop.
        if not infos:
            return {}
        return {k: torch.stack([i[k] for i in infos]).mean() for k in infos[0]}

    def _skip_if_nonfinite(self, opt: Any, loss: Tensor, epoch: int, minibatch: int) -> None:
        """Drop this step's gradients if the loss or a gradient is NaN / inf, so that ``opt.step()``
        leaves the weights and the optimizer state alone (optimizers skip parameters whose grad is
        None) while Lightning still counts the step. Stops after ``max_nonfinite_updates`` in a row.

        The check costs one host sync per optimizer step (as ``torch.amp.GradScaler``'s skip does):
        whether to step must be known on the host. On CPU it is free. Under a sharded strategy each
        rank holds part of the gradients, so the verdict is all-reduced: every rank skips together.
        """
        grads = [p.grad for p in self.policy.parameters() if p.grad is not None]
        bad = torch.stack([~torch.isfinite(loss).all()] + [~torch.isfinite(g).all() for g in grads])
        flags = bad.to(torch.float32)
        if dist.is_available() and dist.is_initialized() and self.trainer.world_size > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        flags = flags.tolist()  # the one host sync
        if not any(flags):
            self._nonfinite_in_a_row = 0
            return
        opt.zero_grad(set_to_none=True)
        self.skipped_updates += 1
        self._nonfinite_in_a_row += 1
        what = "loss" if flags[0] else "gradient"
        where = (
            f"optimizer step {self.global_step} (update {self.policy_version}, epoch {epoch}, "
            f"minibatch {minibatch})"
        )
        limit = self.hparams.get("max_nonfinite_updates", 3)
        if self._nonfinite_in_a_row >= limit:
            raise FloatingPointError(
                f"non-finite {what} at {where}: {self._nonfinite_in_a_row} optimizer steps in a row "
                f"skipped (--model.max_nonfinite_updates {limit}); the weights are those before them"
            )
        rank_zero_warn(f"fastlight: non-finite {what} at {where}: step skipped")

    def _global_count(self, valid: Tensor) -> Tensor | None:
        """SMPO denominator under DDP: all-reduced valid count / world size, so that DDP's
        gradient averaging yields the exact global masked mean. ``None`` in one process."""
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
        n = max(rollout.num_valid, 1)
        shown = {k: metrics.pop(k) for k in ("rollout/return",) if k in metrics}
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=n)
        self.log_dict(shown, on_step=True, on_epoch=False, batch_size=n, prog_bar=True)


def _build_policy_hint(module: RLModule, error: AttributeError) -> str:
    """One line (with the flag naming the class, for the CLI's one-line errors) saying what to do."""
    name, path = type(module).__name__, class_path(type(module))
    return (
        f"--model.class_path {path}: {name}.build_policy() raised AttributeError: {error}. "
        f"build_policy() runs in configure_model(), after __init__: set every attribute it reads in "
        f"{name}.__init__ (e.g. `super().__init__(**kwargs)` then `self.width = width`), or build the "
        f"policy elsewhere and pass it as --model.policy"
    )


def _check_mlp_sizes(obs_dim: int, action_dim: int) -> None:
    if obs_dim < 1 or action_dim < 1:
        raise ValueError(
            f"--model.obs_dim and --model.action_dim must be >= 1 (linked from the data module by "
            f"`fastlight fit`), got {obs_dim} and {action_dim}"
        )


def _validate(args: dict[str, Any]) -> None:
    """Refuse bad settings up front, naming the CLI flag and the allowed values."""
    policy = args["policy"]
    if isinstance(policy, str):  # hparams of a checkpoint whose policy was passed as an object
        name = policy.rsplit(".", 1)[-1]
        raise ValueError(
            f"this module's policy ({policy}) was passed as a Python object, so a checkpoint cannot "
            f"rebuild it: pass it again, e.g. load_from_checkpoint(path, policy={name}(...))"
        )
    if policy is not None and not isinstance(policy, nn.Module):
        raise TypeError(
            f"--model.policy must be an nn.Module (class_path + init_args), got {type(policy).__name__}"
        )
    if policy is not None and tuple(args["hidden_sizes"]) != (64, 64):
        raise ValueError(
            "--model.hidden_sizes sizes the default MLP policy and has no effect with --model.policy: "
            "set the injected policy's own sizes in --model.policy.init_args"
        )
    if args["ratio_granularity"] not in GRANULARITIES:
        raise ValueError(
            f"--model.ratio_granularity must be one of {' | '.join(GRANULARITIES)}, "
            f"got {args['ratio_granularity']!r}"
        )
    if args.get("max_nonfinite_updates", 3) < 0:
        raise ValueError(f"--model.max_nonfinite_updates must be >= 0, got {args['max_nonfinite_updates']}")
    if args.get("value_warmup_updates", 0) < 0:
        raise ValueError(f"--model.value_warmup_updates must be >= 0, got {args['value_warmup_updates']}")
    for name in ("update_epochs", "num_minibatches"):
        if args[name] < 1:
            raise ValueError(f"--model.{name} must be >= 1, got {args[name]}")
    if args["tokens_per_action"] is not None and args["tokens_per_action"] < 1:
        raise ValueError(
            f"--model.tokens_per_action must be >= 1 or null (the tokens of one env action), "
            f"got {args['tokens_per_action']}"
        )
    for name in ("gamma", "gae_lambda"):
        if not 0.0 <= args[name] <= 1.0:
            raise ValueError(f"--model.{name} must be in [0, 1], got {args[name]}")
    if args["lr"] <= 0:
        raise ValueError(f"--model.lr must be > 0, got {args['lr']}")
    for name in ("value_clip_eps", "max_grad_norm"):
        if args[name] is not None and args[name] <= 0:
            raise ValueError(f"--model.{name} must be > 0 or null, got {args[name]}")
