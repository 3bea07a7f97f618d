"""``VLAModule``: RLModule training a token-level :class:`~fastlight.models.vla.VLAPolicy` (AcceRL).

The update is the RLModule's (FAST §SMPO masked means, masked GAE, K epochs x M minibatches);
what changes is the policy and its batch shapes:

- actions are action-token bins ``[T, E, K]`` (long), behaviour log-probs ``[T, E, K]`` and,
  in the loss, ``[N, K]`` log-probs and entropies against ``[N]`` advantages and ``valid``: the
  losses broadcast the per-step advantage over the K tokens and average over valid tokens
  (AcceRL §token-level ratios; ``ratio_granularity`` ``action`` / ``chunk`` for ablations);
- the default objective is GIPO (AcceRL §GIPO), PPO and SAPO stay selectable;
- the value head (AcceRL §value head: attention pooling over *detached* action-token states +
  step embedding) has its own optimizer param group and learning rate ``value_lr``; the value
  loss never reaches the backbone;
- ``recompute_values`` re-runs the latest critic (with the episode ``step``) before GAE (AcceRL
  §value recomputation).

Env sizes linked by ``fastlight fit`` (``obs_dim``, ``action_dim``, ``continuous``): the env's
continuous action size *is* the number of action tokens ``K`` (one token per dimension,
``VLAPolicy.env_action`` maps bins back to ``[-1, 1]``), and ``obs_dim`` is 0 for the dict
observations a VLA reads. :meth:`check_env_spec` refuses discrete envs and mismatched
observation keys / shapes before any sampler starts.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from torch import nn

from fastlight.models.vla import DECODING_MODES, VLAPolicy
from fastlight.modules.rl_module import RLModule


class VLAModule(RLModule):
    """PPO / GIPO / SAPO fine-tuning of a VLA token policy over a transformers causal LM.

    Args:
        backbone: local folder of a saved causal LM (``from_pretrained``); ``None`` builds a random
            Llama from ``vocab_size`` .. ``intermediate_size``.
        action_dim: ``K`` action tokens, one per continuous action dimension (linked from the env).
        n_bins: bins per action dimension (= action vocabulary, the last ``n_bins`` token ids).
        image_size, patch_size: square image side and patch side (the env's ``image_size``).
        proprio_dim: size of ``obs["proprio"]`` (0: the env sends none).
        max_text_len: longest instruction the policy accepts.
        max_episode_steps: size of the value head's step embedding.
        decoding: ``parallel`` (one forward for the K tokens) or ``autoregressive``.
        prune_head: prune the ``lm_head`` to the action rows (AcceRL §lm_head pruning).
        vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size: the
            random Llama built when ``backbone`` is null.
        value_mlp_hidden: hidden width of the value head's MLP.
        value_lr: learning rate of the value head's param group (``None``: ``lr``).
        objective: ``ppo | gipo | sapo`` (default ``gipo``, AcceRL).
        obs_dim, continuous: the env's flat observation size (0 for dict observations) and
            action kind (must be continuous), linked from the data module.
        **kwargs: every other :class:`~fastlight.modules.rl_module.RLModule` setting (``lr``,
            ``ratio_granularity``, ``update_epochs``, ``recompute_values``, ...).
    """

    def __init__(
        self,
        backbone: str | None = None,
        action_dim: int = 4,
        n_bins: int = 256,
        image_size: int = 64,
        patch_size: int = 16,
        proprio_dim: int = 0,
        max_text_len: int = 16,
        max_episode_steps: int = 500,
        decoding: str = "parallel",
        prune_head: bool = True,
        vocab_size: int = 32000,
        hidden_size: int = 64,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        intermediate_size: int = 128,
        value_mlp_hidden: int = 256,
        value_lr: float | None = None,
        objective: str = "gipo",
        obs_dim: int = 0,
        continuous: bool = True,
        **kwargs: Any,
    ) -> None:
        _validate_vla(locals(), kwargs)
        super().__init__(
            obs_dim=obs_dim, action_dim=action_dim, continuous=continuous, objective=objective, **kwargs
        )

    # ------------------------------------------------------------------ RLModule hooks
    def build_policy(self) -> nn.Module:
        h = self.hparams
        return VLAPolicy(
            backbone=h.backbone,
            action_dim=h.action_dim,
            n_bins=h.n_bins,
            image_size=h.image_size,
            patch_size=h.patch_size,
            proprio_dim=h.proprio_dim,
            max_text_len=h.max_text_len,
            max_episode_steps=h.max_episode_steps,
            decoding=h.decoding,
            prune_head=h.prune_head,
            vocab_size=h.vocab_size,
            hidden_size=h.hidden_size,
            num_hidden_layers=h.num_hidden_layers,
            num_attention_heads=h.num_attention_heads,
            intermediate_size=h.intermediate_size,
            value_mlp_hidden=h.value_mlp_hidden,
        )

    def param_groups(self) -> list[dict[str, Any]]:
        """Two Adam groups: the policy (``lr``) and the value head (``value_lr``)."""
        h = self.hparams
        policy = [p for p in self.policy.policy_parameters() if p.requires_grad]
        value = [p for p in self.policy.value_parameters() if p.requires_grad]
        value_lr = h.lr if h.value_lr is None else h.value_lr
        return [{"params": policy, "name": "policy"}, {"params": value, "lr": value_lr, "name": "value_head"}]

    def check_env_spec(self, spec: Any) -> None:
        """Continuous actions with ``K`` dims, and (when the spec carries the observation space) a
        dict observation whose keys and shapes match the policy settings."""
        p = self.policy
        if not spec.continuous:
            raise ValueError(
                "VLAModule maps action tokens to continuous actions in [-1, 1]: --data.env_id needs a Box "
                f"action space, got a discrete one with {spec.action_dim} actions"
            )
        if spec.action_dim != p.action_dim:
            raise ValueError(
                f"--model.action_dim={p.action_dim} (action tokens, one per action dimension) does not match "
                f"the env's action size {spec.action_dim}"
            )
        space = getattr(spec, "observation_space", None)
        if space is not None:
            _check_obs_space(space, self.hparams)


def _check_obs_space(space: gym.Space, h: Any) -> None:
    """Raise ``ValueError`` naming the flag if the env's observation does not fit the policy."""
    if not isinstance(space, gym.spaces.Dict) or "instruction_ids" not in space.spaces:
        raise ValueError(
            f"VLAModule needs a dict observation with 'instruction_ids' (e.g. --data.env_id "
            f"fastlight/MetaWorld-reach-v3), got {space}"
        )
    obs = space.spaces
    text_len = obs["instruction_ids"].shape[0]
    if text_len > h.max_text_len:
        raise ValueError(
            f"--model.max_text_len={h.max_text_len} is shorter than the env's instructions ({text_len})"
        )
    if "image" in obs and tuple(obs["image"].shape) != (h.image_size, h.image_size, 3):
        raise ValueError(
            f"--model.image_size={h.image_size} does not match the env's image {tuple(obs['image'].shape)}"
        )
    env_proprio = obs["proprio"].shape[0] if "proprio" in obs else 0
    if env_proprio != h.proprio_dim:
        raise ValueError(
            f"--model.proprio_dim={h.proprio_dim} does not match the env's proprio size {env_proprio} "
            f"(--data.env_kwargs.proprio_dim)"
        )


def _validate_vla(args: dict[str, Any], rl_kwargs: dict[str, Any]) -> None:
    """VLA settings, checked up front with the CLI flag in the message."""
    if tuple(rl_kwargs.get("hidden_sizes", (64, 64))) != (64, 64):
        # Inherited from RLModule, where it sizes the MLP policy; a VLA has no such MLP.
        raise ValueError(
            "--model.hidden_sizes sizes RLModule's MLP policy and has no effect on a VLA: use "
            "--model.hidden_size / num_hidden_layers / intermediate_size / value_mlp_hidden"
        )
    if args["decoding"] not in DECODING_MODES:
        raise ValueError(
            f"--model.decoding must be one of {' | '.join(DECODING_MODES)}, got {args['decoding']!r}"
        )
    for name in ("action_dim", "max_text_len", "max_episode_steps", "patch_size", "hidden_size"):
        if args[name] < 1:
            raise ValueError(f"--model.{name} must be >= 1, got {args[name]}")
    if args["n_bins"] < 2:
        raise ValueError(f"--model.n_bins must be >= 2, got {args['n_bins']}")
    if args["proprio_dim"] < 0:
        raise ValueError(f"--model.proprio_dim must be >= 0, got {args['proprio_dim']}")
    if args["image_size"] < 1 or args["image_size"] % args["patch_size"]:
        raise ValueError(
            f"--model.image_size must be a positive multiple of --model.patch_size ({args['patch_size']}), "
            f"got {args['image_size']}"
        )
    if args["value_lr"] is not None and args["value_lr"] <= 0:
        raise ValueError(f"--model.value_lr must be > 0 or null, got {args['value_lr']}")
    tpa = rl_kwargs.get("tokens_per_action", 1)
    if rl_kwargs.get("ratio_granularity") == "action" and tpa >= 1 and args["action_dim"] % tpa:
        raise ValueError(
            f"--model.tokens_per_action ({tpa}) must divide --model.action_dim ({args['action_dim']}) "
            "with --model.ratio_granularity action"
        )
