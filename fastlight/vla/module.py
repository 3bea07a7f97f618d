"""``VLAModule``: RLModule training a VLA policy: a token-level one (AcceRL;
:class:`~fastlight.vla.policy.VLAPolicy`, any :class:`~fastlight.models.base.TokenPolicy`) or a flow-matching
one (πRL; :class:`~fastlight.vla.flow_policy.FlowVLAPolicy`, any :class:`~fastlight.models.base.FlowPolicy`),
with log-probs per executed action entry and flow matching as its imitation loss.

The update is the RLModule's (FAST §SMPO masked means, masked GAE, K epochs x M minibatches); what changes:

- actions are action-token bins ``[T, E, K]`` (long), behaviour log-probs ``[T, E, K]``; the losses
  broadcast the per-step advantage over the K tokens and average over valid tokens (AcceRL
  §token-level ratios; ``ratio_granularity`` ``action`` / ``chunk`` for ablations);
- the default objective is GIPO (AcceRL §GIPO), PPO and SAPO stay selectable;
- the value head (AcceRL §value head) has its own param group and ``value_lr`` and never reaches the
  backbone; ``recompute_values``: AcceRL §value recomputation;
- ``sil_steps > 0`` adds self-imitation of the run's own successes after each RL update (Oh et al., 2018;
  not in AcceRL; :mod:`fastlight.vla.self_imitation`);
- action chunks (OpenVLA-OFT's ``action_chunk H``): ``K = H x D`` tokens per call, executed open-loop;
  one transition per chunk with reward ``sum_{i<h} gamma^i r_i`` and bootstrap ``gamma^h``
  (:func:`~fastlight.advantages.chunk_rewards`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from lightning.fabric.utilities.warnings import PossibleUserWarning
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from typing_extensions import override

from fastlight.data.env_spec import EnvSpec, bind_instruction_table
from fastlight.data.protocols import missing_members
from fastlight.models.action_mapping import action_chunk
from fastlight.models.base import ChecksObsSpace, FlowPolicy, Policy, PolicyBase, TokenPolicy
from fastlight.modules.objectives import GIPO, Objective
from fastlight.modules.rl_module import RLModule
from fastlight.rank_state import PER_RANK_KEY, gather_per_rank, per_rank_entries, world
from fastlight.rollout import Rollout
from fastlight.vla.policy import VLAPolicy
from fastlight.vla.self_imitation import SuccessBuffer, buffers_for_world_size

#: Checkpoint key of the self-imitation buffer.
SIL_CHECKPOINT_KEY = "fastlight_success_buffer"


class VLAModule(RLModule):
    """PPO / GIPO / SAPO fine-tuning of a VLA token policy.

    Args:
        policy: a :class:`~fastlight.vla.policy.VLAPolicy`, a FlowPolicy or any ``nn.Module`` implementing
            :class:`~fastlight.models.base.TokenPolicy`; ``None``: a default VLAPolicy, ``action_dim`` tokens.
        value_lr: learning rate of the value head's param group (``None``: ``lr``).
        objective: an :class:`~fastlight.modules.objectives.Objective`; ``None`` is ``GIPO()`` (AcceRL).
        obs_dim: the env's flattened observation size, linked from the data module (0: dict observations).
        action_dim: ``K``, the env's action dimensions (= action tokens), linked from the data module.
        continuous: continuous actions (required), linked from the data module.
        sil_steps: self-imitation optimizer steps after each RL update (0: off); they imitate episodes
            that end ``terminated`` (success in the VLA envs).
        sil_lr: learning rate of the self-imitation optimizer (``None``: ``lr``).
        sil_batch_size: buffer steps in each self-imitation step.
        sil_capacity: steps of successful episodes the buffer keeps per task (oldest dropped).
        **kwargs: every other :class:`~fastlight.modules.rl_module.RLModule` setting (``lr``,
            ``ratio_granularity``, ``update_epochs``, ``recompute_values``, ...).
    """

    default_objective = GIPO

    def __init__(
        self,
        # RLModule's type (a policy that is not a TokenPolicy is refused below, naming what it lacks).
        policy: PolicyBase | Policy | None = None,
        value_lr: float | None = None,
        objective: Objective | None = None,
        obs_dim: int = 0,
        action_dim: int = 4,
        continuous: bool = True,
        sil_steps: int = 0,
        sil_lr: float | None = None,
        sil_batch_size: int = 256,
        sil_capacity: int = 4096,
        **kwargs: Any,
    ) -> None:
        _validate_vla(policy, value_lr, action_dim, kwargs)
        for name, value in (("sil_batch_size", sil_batch_size), ("sil_capacity", sil_capacity)):
            if value < 1:
                raise ValueError(f"--model.{name} must be >= 1, got {value}")
        if sil_steps < 0:
            raise ValueError(f"--model.sil_steps must be >= 0 (0 turns self-imitation off), got {sil_steps}")
        if sil_lr is not None and sil_lr <= 0:
            raise ValueError(f"--model.sil_lr must be > 0 or null, got {sil_lr}")
        super().__init__(
            policy=policy,
            obs_dim=obs_dim,
            action_dim=action_dim,
            continuous=continuous,
            objective=objective,
            **kwargs,
        )
        self.success_buffer = SuccessBuffer(sil_capacity)
        self._sil_ready = False  # this update runs the self-imitation steps (set per training step)
        self._eval_mode_filter: Any = None  # see on_fit_start

    # ------------------------------------------------------------------ RLModule hooks
    def build_policy(self) -> nn.Module:
        """No ``--model.policy``: a VLAPolicy with its defaults and ``K = --model.action_dim``."""
        return VLAPolicy(action_dim=self.hparams.action_dim)

    def param_groups(self) -> list[dict[str, Any]]:
        """Two Adam groups: the policy (``lr``) and the value head (``value_lr``)."""
        h = self.hparams
        policy = [p for p in self.policy.policy_parameters() if p.requires_grad]
        value = [p for p in self.policy.value_parameters() if p.requires_grad]
        value_lr = h.lr if h.value_lr is None else h.value_lr
        return [{"params": policy, "name": "policy"}, {"params": value, "lr": value_lr, "name": "value_head"}]

    @override
    def configure_optimizers(self) -> Any:
        """The RL optimizer, plus (with ``sil_steps``) an AdamW of the policy parameters for the
        self-imitation steps: their own moments and learning rate, apart from the RL updates'."""
        rl = super().configure_optimizers()
        h = self.hparams
        if not h.get("sil_steps", 0):
            return rl
        params = [p for p in self.policy.policy_parameters() if p.requires_grad]
        sil_lr = h.lr if h.sil_lr is None else h.sil_lr
        return [rl, torch.optim.AdamW([{"params": params, "name": "sil"}], lr=sil_lr, weight_decay=0.0)]

    @property
    @override
    def optimizer_steps_per_update(self) -> int:
        return super().optimizer_steps_per_update + (self.hparams.sil_steps if self._sil_ready else 0)

    @override
    def on_fit_start(self) -> None:
        """Explain a frozen vision tower's eval mode (:func:`_explain_frozen_eval_modules`); the warning
        filter it may add is removed in :meth:`on_train_start`."""
        super().on_fit_start()
        self._eval_mode_filter = _explain_frozen_eval_modules(self, self.core_policy)

    @override
    def on_train_start(self) -> None:
        super().on_train_start()  # after Lightning's eval-mode check (FitLoop.on_run_start)
        entry, self._eval_mode_filter = self._eval_mode_filter, None
        if entry is not None and entry in warnings.filters:
            warnings.filters.remove(entry)

    @override
    def training_step(self, batch: Rollout, batch_idx: int) -> None:
        h = self.hparams
        if not h.sil_steps:
            return super().training_step(batch, batch_idx)
        if isinstance(batch, Rollout):
            self.success_buffer.add_rollout(batch)
        warm = self.policy_version >= h.get("value_warmup_updates", 0)
        # Per-rank buffers: the steps run on every rank or none, or gradient all-reduces would hang.
        ready = warm and len(self.success_buffer) > 0
        self._sil_ready = self.trainer.strategy.reduce_boolean_decision(ready, all=True)
        super().training_step(batch, batch_idx)  # the RL update first: its ratios need the behaviour policy
        info = self._self_imitation() if self._sil_ready else {}
        buf = self.success_buffer
        metrics = {
            **{f"sil/{k}": v for k, v in info.items()},
            "sil/buffer_steps": float(len(buf)),
            "sil/episodes": float(buf.episodes_added),
            "sil/tasks": float(len(buf.steps_per_task())),
        }
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=max(batch.num_valid, 1))

    def _self_imitation(self) -> dict[str, Tensor]:
        """``sil_steps`` optimizer steps of the policy's imitation loss on buffer steps (Oh et al., 2018)."""
        h = self.hparams
        opt = self.optimizers()[1]
        infos = []
        for i in range(h.sil_steps):
            obs, actions, valid = self.success_buffer.sample(h.sil_batch_size)
            obs = {k: v.to(self.device) for k, v in obs.items()}
            valid = None if valid is None else valid.to(self.device)  # chunk steps never executed: False
            loss, info = self.policy.imitation_loss(obs, actions.to(self.device), valid, own=True)
            opt.zero_grad(set_to_none=True)
            self.manual_backward(loss)
            if h.max_grad_norm is not None:
                self.clip_gradients(opt, gradient_clip_val=h.max_grad_norm, gradient_clip_algorithm="norm")
            if h.get("max_nonfinite_updates", 3):
                self._skip_if_nonfinite(opt, loss, epoch=0, minibatch=i)
            opt.step()
            infos.append({"loss": loss.detach(), **info})
        return {k: torch.stack([i[k] for i in infos]).mean() for k in infos[0]}

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.hparams.sil_steps:
            # Each rank fills its own buffer from its own rollouts: every rank's goes into the file.
            own = self.success_buffer.state_dict()
            checkpoint[SIL_CHECKPOINT_KEY] = own | {PER_RANK_KEY: gather_per_rank(own)}

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if SIL_CHECKPOINT_KEY in checkpoint:
            # On another number of ranks the saved buffers are merged, then split evenly.
            saved = checkpoint[SIL_CHECKPOINT_KEY]
            rank, size = world()
            states = per_rank_entries(saved, saved)
            mine = buffers_for_world_size(states, size, self.success_buffer.capacity)[rank]
            self.success_buffer.load_state_dict(mine)

    def check_env_spec(self, spec: Any) -> None:
        """Continuous actions with ``K`` dims, and a dict observation (when the spec carries its space)
        whose keys and shapes match the policy."""
        p = self.policy
        if not spec.continuous:
            raise ValueError(
                "VLAModule maps action tokens to continuous actions in [-1, 1]: --data.env_id needs a Box "
                f"action space, got a discrete one with {spec.action_dim} actions"
            )
        if spec.action_dim != p.action_dim:
            raise ValueError(
                f"{self.policy_flag('action_dim')}={p.action_dim} (action tokens, one per action dimension) "
                f"does not match the env's action size {spec.action_dim}"
            )
        space = spec.observation_space  # None when the EnvSpec was built without a space
        if space is None:
            return
        if isinstance(p, ChecksObsSpace):
            p.check_obs_space(space)
        bind_instruction_table(p, spec.instructions if isinstance(spec, EnvSpec) else None)


def _explain_frozen_eval_modules(module: nn.Module, policy: nn.Module | None) -> Any:
    """Log how many of ``module``'s eval-mode modules are the VLAPolicy's frozen ones; when they are
    all of them, add and return a filter for Lightning's eval-mode warning of that count, else ``None``."""
    if not isinstance(policy, VLAPolicy) or not policy.frozen_modules:
        return None
    frozen = {id(m) for name in policy.frozen_modules for m in policy.get_submodule(name).modules()}
    in_eval = [(name, id(m) in frozen) for name, m in module.named_modules() if not m.training]
    ours, others = sum(f for _, f in in_eval), [name for name, f in in_eval if not f]
    if not ours:
        return None
    why = "image_size: null, unused" if policy.image_size is None else "freeze_vision: true"
    where = ", ".join(policy.frozen_modules)
    said = f"VLAPolicy: the {ours} modules of its frozen {where} stay in eval mode ({why})"
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        rank_zero_info(
            f"{said}; Lightning's eval-mode warning counts them and {len(others)} other(s): {shown}"
        )
        return None
    rank_zero_info(f"{said}, the only modules in eval mode")
    warnings.filterwarnings(
        "ignore", message=rf"Found {ours} module\(s\) in eval mode at the start of training\.",
        category=PossibleUserWarning,
    )  # fmt: skip
    return warnings.filters[0]


def _validate_vla(policy: Any, value_lr: float | None, action_dim: int, rl_kwargs: dict[str, Any]) -> None:
    """VLA settings, checked up front with the CLI flag in the message."""
    if policy is not None and not isinstance(policy, (str, FlowPolicy)):
        missing = missing_members(policy, TokenPolicy)
        if type(policy).forward is nn.Module.forward:  # every nn.Module has one that raises
            missing = sorted({*missing, "forward"})
        if missing or not isinstance(policy, nn.Module):
            lacks = ", ".join(missing) if missing else "nn.Module (it is not one)"
            raise ValueError(
                f"--model.policy {type(policy).__module__}.{type(policy).__qualname__} does not implement "
                f"fastlight.models.base.TokenPolicy, which VLAModule trains (fastlight.vla.policy.VLAPolicy "
                f"does): it lacks {lacks}"
            )
    if tuple(rl_kwargs.get("hidden_sizes", (64, 64))) != (64, 64):
        raise ValueError(
            "--model.hidden_sizes sizes RLModule's MLP policy and has no effect on a VLA: use "
            "--model.policy.init_args.hidden_size / num_hidden_layers / intermediate_size / value_mlp_hidden"
        )
    if value_lr is not None and value_lr <= 0:
        raise ValueError(f"--model.value_lr must be > 0 or null, got {value_lr}")
    tpa = rl_kwargs.get("tokens_per_action")
    # K, the tokens per call: action_dim x action_chunk (a ratio group may span chunk steps).
    token_policy = isinstance(policy, (TokenPolicy, FlowPolicy))
    k = action_tokens(policy) if token_policy else action_dim
    if rl_kwargs.get("ratio_granularity") == "action" and tpa is not None and tpa >= 1 and k % tpa:
        chunk = k // policy.action_dim if token_policy else 1
        split = f" (action_chunk {chunk} x action_dim {k // chunk})" if chunk > 1 else ""
        allowed = ", ".join(str(d) for d in range(1, k + 1) if k % d == 0)
        raise ValueError(
            f"--model.tokens_per_action {tpa} must divide the policy's K={k} action tokens per call{split} "
            f"with --model.ratio_granularity action: one of {allowed}, or null (the tokens of one env action)"
        )


def action_tokens(policy: TokenPolicy | FlowPolicy) -> int:
    """``K``, a VLA policy's action tokens (entries) per call: ``action_dim`` times its action chunk (1 for a
    policy whose mapping is not a :class:`~fastlight.models.action_mapping.ChunkedActionMapping`)."""
    return policy.action_dim * (action_chunk(policy.action_mapping()) or 1)
