"""``PolicyModule``: owning a policy, which ``RLModule`` builds on: where it comes from, what wraps it
(``--model.init_from``, the normalisers), its sizes against the env, and what a loading checkpoint is
checked for. It reads ``RLModule``'s hparams of those names.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from torch import Tensor, nn
from typing_extensions import override

from fastlight.data.cpu_copy import cpu_copy
from fastlight.models.normalization import NormalizedPolicy, resolve_normalization, with_normalization
from fastlight.modules.checkpointing import check_weights_fit, keep_policy_config, use_typed_learning_rates
from fastlight.modules.checks import build_policy_hint, policy_not_built
from fastlight.modules.init_from import init_policy_from
from fastlight.modules.sharding import (
    STRATEGY_NAME,
    is_sharded,
    refuse_fsdp1,
    register_strategy,
    shard_policy,
)

register_strategy()  # --trainer.strategy fsdp2, wherever a fastlight module is used


class PolicyModule(L.LightningModule):
    """A LightningModule that owns ``self.policy``: built in ``configure_model`` unless injected."""

    policy: nn.Module  # set by __init__ (injected) or configure_model (build_policy)

    def __init__(self) -> None:
        super().__init__()
        self._initialised_from = False  # --model.init_from loaded (once, under a Trainer)

    def build_policy(self) -> nn.Module:
        """The policy when none is injected; runs once, in ``configure_model``."""
        raise NotImplementedError(f"{type(self).__name__} builds no policy: inject one (--model.policy)")

    def __getattr__(self, name: str) -> Any:
        if name == "policy" and "policy" not in self.__dict__.get("_modules", {}):
            raise AttributeError(policy_not_built(type(self)))
        return super().__getattr__(name)

    @override
    def configure_model(self) -> None:
        """Build the policy with :meth:`build_policy` unless it exists; load ``--model.init_from``; wrap it
        in the normalisers when they are on; under ``fsdp2``, keep the samplers' whole copy and shard it.
        Runs after ``setup``, before a checkpoint is restored; idempotent."""
        if self._trainer is not None:
            refuse_fsdp1(self.trainer.strategy)
        if "policy" not in self._modules:
            try:
                policy = self.build_policy()
            except AttributeError as e:  # e.g. an attribute the subclass never set: say where to set it
                raise TypeError(build_policy_hint(type(self), e)) from e
            self.policy = policy
        # Only under a Trainer: a module rebuilt by load_from_checkpoint gets its weights from there.
        if self.hparams.get("init_from") and self._trainer is not None and not self._initialised_from:
            init_policy_from(self.core_policy, self.hparams.init_from)
            self._initialised_from = True
        norm_obs, norm_ret = self.normalization()
        wrapped = with_normalization(
            self.policy, obs_dim=self.hparams.obs_dim, normalize_obs=norm_obs, normalize_returns=norm_ret
        )
        if wrapped is not self.policy:
            self.policy = wrapped
        mesh = self.device_mesh  # set by --trainer.strategy fsdp2 (ModelParallelStrategy) only
        if mesh is not None and not is_sharded(self.core_policy):
            # The samplers' copy, made while the policy is whole; kept out of _modules (no submodule).
            self.__dict__["_unsharded_copy"] = cpu_copy(self.policy)
            shard_policy(self.core_policy, mesh)

    def rollout_copy(self) -> nn.Module:
        """A CPU copy of the policy for the samplers and the inference worker (under ``fsdp2`` the one made
        before sharding, handed over once); its trainable weights arrive with the first publish."""
        if not is_sharded(self.core_policy):
            return cpu_copy(self.policy)
        copy = self.__dict__.pop("_unsharded_copy", None)
        if copy is None:
            raise RuntimeError(
                f"{type(self).__name__}.rollout_copy: the policy is sharded (--trainer.strategy "
                f"{STRATEGY_NAME}) and its copy from before sharding was already handed out"
            )
        return copy

    def normalization(self) -> tuple[bool, bool]:
        """Whether observations and returns are normalised (``None`` settings resolved)."""
        h = self.hparams
        return resolve_normalization(
            continuous=bool(h.get("continuous")),
            obs_dim=0 if h.get("spaces") else int(h.get("obs_dim") or 0),  # images and parts: not vectors
            normalize_obs=h.get("normalize_obs"),
            normalize_returns=h.get("normalize_returns"),
        )

    @property
    def core_policy(self) -> nn.Module:
        """The actor-critic itself, inside the normalisation wrapper when there is one."""
        policy = self.policy
        return policy.policy if isinstance(policy, NormalizedPolicy) else policy

    def sum_over_ranks(self, x: Tensor) -> Tensor:
        """A statistic summed over the DDP ranks (identity on one process)."""
        trainer = self._trainer
        if trainer is None or trainer.world_size <= 1:
            return x
        return trainer.strategy.reduce(x, reduce_op="sum")

    def policy_flag(self, name: str) -> str:
        """The CLI flag that sets the policy's ``name`` (of an injected policy, or of the default one)."""
        injected = self.hparams.get("policy") is not None
        return f"--model.policy.init_args.{name}" if injected else f"--model.{name}"

    def check_env_spec(self, spec: Any) -> None:
        """Refuse a policy whose sizes do not match the env (before the samplers start)."""
        keys = ("obs_dim", "action_dim", "continuous", "spaces")  # spaces: MultiInputActorCritic's
        mine = {k: getattr(self.core_policy, k, None) for k in keys}
        theirs = {k: getattr(spec, k, None) for k in keys}
        for key, value in mine.items():
            if value is not None and value != theirs[key]:
                raise ValueError(
                    f"{self.policy_flag(key)}={value} does not match the env's {key}={theirs[key]} "
                    f"(observation/action space of --data.env_id)"
                )

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse weights that cannot load; keep a CLI checkpoint's policy config; use the typed rates."""
        check_weights_fit(self, checkpoint)
        keep_policy_config(self, checkpoint)
        use_typed_learning_rates(self, checkpoint)
