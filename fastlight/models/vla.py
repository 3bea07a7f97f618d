"""``VLAPolicy``: a Vision-Language-Action token policy over a transformers causal LM (AcceRL).

The policy reads an observation dict (batch ``N``)::

    image             [N, H, W, 3] uint8 (or float [N, 3, H, W] in [0, 1])   optional
    proprio           [N, P] float                                           iff proprio_dim > 0
    instruction_ids   [N, L] long, right-padded, L <= max_text_len
    instruction_mask  [N, L] (1 = real token)                                optional (all ones)

and builds the input sequence ``[image patches][proprio token][instruction][K action slots]``
(``K = action_dim``) as ``inputs_embeds`` for the backbone; the attention mask hides padded
instruction tokens and position ids skip them, so the amount of padding does not matter.

Decoding (``decoding``):

- ``"parallel"`` (OpenVLA-OFT): the K slots are learned placeholder embeddings; one forward
  gives all K action-token distributions at once, each conditioned on the observation only.
- ``"autoregressive"``: slot 0 is the first placeholder and slot ``k >= 1`` is the input
  embedding of the previous action token ``a_{k-1}``; ``evaluate`` teacher-forces the given
  actions in one forward, ``act`` samples token by token (``K`` forwards, no KV cache).

Logits at the K slots are restricted to the action vocabulary (the last ``n_bins`` ids, see
:class:`~fastlight.models.action_tokenizer.ActionTokenizer`): with ``prune_head=True`` the
``lm_head`` is pruned to those rows (AcceRL §lm_head pruning) and its logits are the bins
directly; otherwise the full-vocabulary logits are sliced to the same rows, so both agree.
``actions`` are bins ``[N, K]`` long; ``logprobs`` and ``entropy`` are per token ``[N, K]``
(AcceRL's token-level ratios). :meth:`VLAPolicy.bins_to_env_action` maps bins to ``[-1, 1]``.

Values come from :class:`~fastlight.models.value_heads.ActionAwareValueHead` on the detached
last-layer hidden states at the K slots of the *placeholder* sequence, plus the episode step.
In parallel mode that is the same forward as the policy's; in autoregressive mode the
teacher-forced slots would leak the chosen action into ``V``, so ``evaluate`` runs one extra
placeholder forward under ``no_grad`` for the critic (the same one ``act`` starts with).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor, nn
from torch.distributions import Categorical

from fastlight.extras import import_extra
from fastlight.models.action_mapping import BinsToActions
from fastlight.models.action_tokenizer import ActionTokenizer
from fastlight.models.base import ActionMapping, ActOutput, EvalOutput, PolicyBase
from fastlight.models.pruning import load_pruned_causal_lm, prune_lm_head, pruned_range
from fastlight.models.value_heads import ActionAwareValueHead
from fastlight.models.vision import PatchEncoder

#: How the action tokens of one policy call are decoded (see the module docstring).
Decoding = Literal["parallel", "autoregressive"]
DECODING_MODES: tuple[str, ...] = get_args(Decoding)


def build_llama(
    vocab_size: int,
    hidden_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    intermediate_size: int,
    tie_word_embeddings: bool = False,
) -> nn.Module:
    """A randomly initialised ``LlamaForCausalLM`` from a ``LlamaConfig`` (nothing downloaded)."""
    transformers = import_extra("transformers", extra="vla", what="the VLA policy")
    LlamaConfig, LlamaForCausalLM = transformers.LlamaConfig, transformers.LlamaForCausalLM

    if hidden_size % num_attention_heads:
        raise ValueError(
            "hidden_size must be divisible by num_attention_heads, "
            f"got {hidden_size} and {num_attention_heads}"
        )
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        tie_word_embeddings=tie_word_embeddings,
    )
    return LlamaForCausalLM(cfg)


class VLAPolicy(PolicyBase):
    """Token-level VLA actor-critic implementing the fastlight policy interface (AcceRL).

    Args:
        backbone: local folder for ``AutoModelForCausalLM.from_pretrained`` (a folder saved after
            pruning is loaded with :func:`~fastlight.models.pruning.load_pruned_causal_lm`);
            ``None`` builds a random Llama from the size settings below, which are ignored otherwise.
        action_dim: ``K``, action tokens per step (one per action dimension).
        n_bins: bins per action dimension = action vocabulary size.
        image_size, patch_size: square image side and patch side of the patch encoder.
        proprio_dim: proprioceptive state size (0: no proprio token).
        max_text_len: longest instruction ``L`` accepted.
        max_episode_steps: size of the value head's step embedding (longer steps are clamped).
        decoding: ``"parallel"`` or ``"autoregressive"`` (see the module docstring).
        prune_head: prune the ``lm_head`` to the ``n_bins`` action rows (AcceRL).
        vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
            tie_word_embeddings: the Llama built when ``backbone is None``.
        value_mlp_hidden: hidden width of the value head's MLP.
        temperature: sampling temperature of the acting policy: ``act`` samples from, and
            ``act`` / ``evaluate`` score actions under, ``softmax(logits / temperature)``, so the
            behaviour log-probs and the RL ratios are of the same tempered policy (as LLM RL
            frameworks apply their rollout temperature in the learner too). ``forward`` (SFT and
            self-imitation cross-entropy) and argmax actions do not depend on it. Below 1 the policy
            explores closer to its greedy actions, which is what the evaluation plays.
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
        decoding: Decoding = "parallel",
        prune_head: bool = True,
        vocab_size: int = 32000,
        hidden_size: int = 64,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        intermediate_size: int = 128,
        tie_word_embeddings: bool = False,
        value_mlp_hidden: int = 256,
        temperature: float = 1.0,
    ) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"--model.policy.init_args.temperature must be > 0, got {temperature}")
        if decoding not in DECODING_MODES:
            raise ValueError(f"decoding must be one of {DECODING_MODES}, got {decoding!r}")
        for name, val, low in (("action_dim", action_dim, 1), ("proprio_dim", proprio_dim, 0)):
            if val < low:
                raise ValueError(f"{name} must be >= {low}, got {val}")
        if max_text_len < 1:
            raise ValueError(f"max_text_len must be >= 1, got {max_text_len}")
        self.action_dim, self.n_bins, self.proprio_dim = action_dim, n_bins, proprio_dim
        self.max_text_len, self.decoding, self.prune_head = max_text_len, decoding, prune_head
        self.temperature = float(temperature)
        self.backbone = self._load_backbone(
            backbone, vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
            tie_word_embeddings,
        )  # fmt: skip
        text_cfg = self.backbone.config.get_text_config()
        hidden = int(text_cfg.hidden_size)
        self.action_tokenizer = ActionTokenizer(int(text_cfg.vocab_size), n_bins)
        self._setup_head(prune_head)
        self.vision = PatchEncoder(image_size, patch_size, channels=3, dim=hidden, out_dim=hidden)
        self.proprio_proj = nn.Linear(proprio_dim, hidden) if proprio_dim > 0 else None
        self.action_queries = nn.Parameter(torch.randn(action_dim, hidden) * 0.02)
        self.value_head = ActionAwareValueHead(hidden, max_episode_steps, value_mlp_hidden)

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _load_backbone(path: str | None, *llama_sizes) -> nn.Module:
        if path is None:
            return build_llama(*llama_sizes)
        return load_pruned_causal_lm(path)

    def _setup_head(self, prune_head: bool) -> None:
        """Prune the head to the action rows, or check that an already pruned one matches."""
        tok = self.action_tokenizer
        rng = pruned_range(self.backbone)
        if rng is not None:
            if not prune_head or rng != (tok.first_id, tok.last_id):
                raise ValueError(
                    f"backbone head is pruned to {list(rng)}; it needs prune_head=True and action ids "
                    f"[{tok.first_id}, {tok.last_id}) (n_bins={self.n_bins}), got prune_head={prune_head}"
                )
            return
        out = self.backbone.get_output_embeddings().out_features
        if out < tok.last_id:
            raise ValueError(f"lm_head has {out} rows, fewer than the vocab_size {tok.last_id}")
        if prune_head:
            prune_lm_head(self.backbone, tok.first_id, tok.last_id)

    # ------------------------------------------------------------------ parameter groups
    def policy_parameters(self) -> list[nn.Parameter]:
        """Every parameter except the value head's (backbone, vision, proprio, placeholders)."""
        return [p for n, p in self.named_parameters() if not n.startswith("value_head.")]

    def value_parameters(self) -> list[nn.Parameter]:
        """The value head's parameters (their own optimizer param group / learning rate)."""
        return list(self.value_head.parameters())

    # ------------------------------------------------------------------ sequence building
    def _embed_dtype(self) -> torch.dtype:
        return self.backbone.get_input_embeddings().weight.dtype

    def _prefix(self, obs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Observation dict -> prefix embeddings ``[N, S0, H]`` and mask ``[N, S0]`` (long)."""
        if not isinstance(obs, dict) or "instruction_ids" not in obs:
            raise ValueError("VLAPolicy obs must be a dict with 'instruction_ids' [N, L] (and optional keys)")
        ids = obs["instruction_ids"]
        if ids.dim() != 2 or ids.shape[1] > self.max_text_len or ids.is_floating_point():
            raise ValueError(
                f"instruction_ids must be integer [N, L<=max_text_len={self.max_text_len}], "
                f"got {tuple(ids.shape)} {ids.dtype}"
            )
        n, dev, dtype = ids.shape[0], ids.device, self._embed_dtype()
        mask = obs.get("instruction_mask")
        mask = torch.ones_like(ids) if mask is None else mask
        if mask.shape != ids.shape:
            raise ValueError(
                f"instruction_mask shape {tuple(mask.shape)} != instruction_ids {tuple(ids.shape)}"
            )
        parts, masks = [], []
        if "image" in obs:
            img = self.vision(obs["image"]).to(dtype)
            if img.shape[0] != n:
                raise ValueError(
                    f"image batch {tuple(obs['image'].shape)} != instruction_ids {tuple(ids.shape)}"
                )
            parts.append(img)
            masks.append(torch.ones(n, img.shape[1], dtype=torch.long, device=dev))
        parts_p, masks_p = self._proprio_token(obs, n)
        parts += parts_p
        masks += masks_p
        parts.append(self.backbone.get_input_embeddings()(ids.long()))
        masks.append(mask.long())
        return torch.cat(parts, dim=1), torch.cat(masks, dim=1)

    def _proprio_token(self, obs: dict[str, Tensor], n: int) -> tuple[list[Tensor], list[Tensor]]:
        """``proprio [N, P]`` -> one token ``[N, 1, H]`` (empty lists when ``proprio_dim == 0``)."""
        if self.proprio_proj is None:
            if "proprio" in obs:
                raise ValueError(f"obs has 'proprio' {tuple(obs['proprio'].shape)} but proprio_dim=0")
            return [], []
        prop = obs.get("proprio")
        if prop is None or prop.shape != (n, self.proprio_dim):
            got = None if prop is None else tuple(prop.shape)
            raise ValueError(f"proprio must be [N={n}, proprio_dim={self.proprio_dim}], got {got}")
        tok = self.proprio_proj(prop.to(self.proprio_proj.weight.dtype)).unsqueeze(1).to(self._embed_dtype())
        return [tok], [torch.ones(n, 1, dtype=torch.long, device=prop.device)]

    def _slots(self, n: int, actions: Tensor | None) -> Tensor:
        """The K action-slot embeddings ``[N, K, H]``: placeholders, or (autoregressive, ``actions``
        ``[N, k]`` bins given) slot 0 = placeholder and slot ``j >= 1`` = embedding of ``a_{j-1}``.
        With ``k < K`` actions only the first ``k + 1`` slots are returned."""
        q = self.action_queries.to(self._embed_dtype()).unsqueeze(0).expand(n, -1, -1)
        if actions is None:
            return q
        prev = self.backbone.get_input_embeddings()(
            actions[:, : self.action_dim - 1] + self.action_tokenizer.first_id
        )
        return torch.cat([q[:, :1], prev], dim=1)

    # ------------------------------------------------------------------ forward passes
    def _hidden(self, prefix: tuple[Tensor, Tensor], slots: Tensor) -> Tensor:
        """Last-layer hidden states at the slots: ``[N, S0, H] + [N, k, H] -> [N, k, H]``."""
        emb, mask = prefix
        emb = torch.cat([emb, slots], dim=1)
        mask = torch.cat([mask, mask.new_ones(slots.shape[:2])], dim=1)
        position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0)
        out = self.backbone.base_model(inputs_embeds=emb, attention_mask=mask, position_ids=position_ids)
        return out.last_hidden_state[:, -slots.shape[1] :]

    def _logits(self, hidden: Tensor) -> Tensor:
        """Hidden ``[N, k, H]`` -> action logits ``[N, k, n_bins]`` (float32)."""
        logits = self.backbone.get_output_embeddings()(hidden)
        if logits.shape[-1] != self.n_bins:
            logits = logits[..., self.action_tokenizer.first_id : self.action_tokenizer.last_id]
        return logits.float()

    def _tempered(self, logits: Tensor) -> Tensor:
        """The acting policy's logits: ``logits / temperature`` (the same argmax)."""
        return logits if self.temperature == 1.0 else logits / self.temperature

    def forward(self, obs: dict[str, Tensor], actions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Action logits ``[N, K, n_bins]`` and slot hidden states ``[N, K, H]``.

        Parallel decoding ignores ``actions``; autoregressive decoding teacher-forces the bins
        ``actions [N, K]`` (``None``: all-placeholder slots, only slot 0's logits are then a policy).
        """
        prefix = self._prefix(obs)
        n = prefix[0].shape[0]
        use = actions if self.decoding == "autoregressive" else None
        hidden = self._hidden(prefix, self._slots(n, use))
        return self._logits(hidden), hidden

    def _check_step(self, step: Tensor | None, n: int, device: torch.device) -> Tensor:
        if step is None:
            return torch.zeros(n, dtype=torch.long, device=device)
        if step.shape != (n,):
            raise ValueError(f"step must be [N={n}], got shape {tuple(step.shape)}")
        return step

    # ------------------------------------------------------------------ policy interface
    def act(
        self, obs: dict[str, Tensor], *, step: Tensor | None = None, deterministic: bool = False
    ) -> ActOutput:
        """Sample bins ``[N, K]`` (argmax if ``deterministic``), token logprobs ``[N, K]``, values ``[N]``."""
        prefix = self._prefix(obs)
        n = prefix[0].shape[0]
        step = self._check_step(step, n, prefix[0].device)
        hidden = self._hidden(prefix, self._slots(n, None))
        values = self.value_head(hidden, step)
        logits = self._tempered(self._logits(hidden))
        if self.decoding == "parallel":
            actions = _choose(logits, deterministic)
            return ActOutput(actions, _token_logprobs(logits, actions), values)
        chosen, logps = [], []
        step_logits = logits[:, :1]  # slot 0 is the placeholder in both modes
        for k in range(self.action_dim):
            if k > 0:  # slots 0..k: the placeholder, then the k tokens chosen so far
                slots = self._slots(n, torch.stack(chosen, 1))
                step_logits = self._tempered(self._logits(self._hidden(prefix, slots)[:, -1:]))
            a_k = _choose(step_logits, deterministic)  # [N, 1]
            chosen.append(a_k[:, 0])
            logps.append(_token_logprobs(step_logits, a_k)[:, 0])
        return ActOutput(torch.stack(chosen, 1), torch.stack(logps, 1), values)

    def evaluate(self, obs: dict[str, Tensor], actions: Tensor, *, step: Tensor | None = None) -> EvalOutput:
        """Token logprobs ``[N, K]``, entropies ``[N, K]`` and values ``[N]`` of bins ``actions [N, K]``."""
        prefix = self._prefix(obs)
        n = prefix[0].shape[0]
        if actions.shape != (n, self.action_dim) or actions.is_floating_point():
            raise ValueError(
                f"actions must be integer bins [N={n}, K={self.action_dim}], got {tuple(actions.shape)}"
            )
        step = self._check_step(step, n, prefix[0].device)
        actions = actions.long()
        if self.decoding == "parallel":
            hidden = self._hidden(prefix, self._slots(n, None))
            logits, value_hidden = self._logits(hidden), hidden
        else:
            logits = self._logits(self._hidden(prefix, self._slots(n, actions)))
            with torch.no_grad():
                value_hidden = self._hidden(prefix, self._slots(n, None))
        logits = self._tempered(logits)
        entropy = Categorical(logits=logits).entropy()
        return EvalOutput(_token_logprobs(logits, actions), entropy, self.value_head(value_hidden, step))

    def value(self, obs: dict[str, Tensor], *, step: Tensor | None = None) -> Tensor:
        """Critic only: values ``[N]`` from the placeholder slots' detached hidden states and ``step``.

        The backbone runs under ``no_grad`` (its states are detached anyway); the value head keeps
        its gradients, for value recomputation / critic updates with the latest weights (AcceRL).
        """
        with torch.no_grad():
            prefix = self._prefix(obs)
            n = prefix[0].shape[0]
            hidden = self._hidden(prefix, self._slots(n, None))
        return self.value_head(hidden, self._check_step(step, n, hidden.device))

    # ------------------------------------------------------------------ actions for the env
    def bins_to_env_action(self, bins: Tensor) -> Tensor:
        """Bins ``[N, K]`` -> float actions ``[N, K]`` in ``[-1, 1]`` (bin centres)."""
        return self.action_tokenizer.decode(bins)

    def action_mapping(self) -> ActionMapping:
        """Bins -> bin centres in ``[-1, 1]``, without the backbone (for inference-served samplers)."""
        return BinsToActions(self.action_tokenizer)


def _choose(logits: Tensor, deterministic: bool) -> Tensor:
    """Logits ``[N, k, B]`` -> bins ``[N, k]``: argmax, or one Categorical sample per token."""
    return logits.argmax(-1) if deterministic else Categorical(logits=logits).sample()


def _token_logprobs(logits: Tensor, actions: Tensor) -> Tensor:
    """``log softmax(logits)[actions]``: ``[N, k, B]`` and ``[N, k]`` -> ``[N, k]``."""
    return torch.log_softmax(logits, dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
