"""``VLAPolicy``: a Vision-Language-Action token policy over a transformers causal LM (AcceRL).

The policy reads an observation dict (batch ``N``)::

    image             [N, H, W, 3] uint8 (patch encoder: or float [N, 3, H, W] in [0, 1])   optional
    proprio           [N, P] float                                           iff proprio_dim > 0
    instruction_ids   [N, L] long, right-padded, L <= max_text_len
    instruction_mask  [N, L] (1 = real token)                                optional (all ones)

and feeds the backbone ``[image patches][proprio token][instruction][K action slots]`` as
``inputs_embeds`` (``K = action_chunk x action_dim``); padded instruction tokens are masked and skipped
by the position ids, so padding does not matter.

Logits at the K slots are restricted to the ``n_bins`` action ids, by a pruned ``lm_head``
(``prune_head``, AcceRL §lm_head pruning) or by slicing the full logits; both agree. ``actions`` are
bins ``[N, K]`` long; ``logprobs`` and ``entropy`` are per token ``[N, K]`` (AcceRL's token-level ratios).
Values: :class:`~fastlight.vla.value_heads.ActionAwareValueHead` on the detached hidden states at the K
slots of the *placeholder* sequence, plus the episode step; in autoregressive mode the teacher-forced
slots would leak the chosen action into ``V``, so ``evaluate`` runs one extra placeholder forward under
``no_grad`` for the critic.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.distributions import Categorical

from fastlight.models.action_mapping import BinsToActions, ChunkActions
from fastlight.models.base import ActionMapping, ActOutput, EvalOutput, PolicyBase
from fastlight.vla.action_head import action_tokenizer, fit_head
from fastlight.vla.decoding import DECODING_MODES, Decoding, choose, token_logprobs
from fastlight.vla.hf_vlm import PicklableCapture, build_llama, load_backbone, position_ids
from fastlight.vla.image_encoder import image_encoder, image_tokens
from fastlight.vla.imitation_loss import TokenImitation
from fastlight.vla.inputs import VLAParts, action_bins, episode_step, instruction_inputs, proprio_input
from fastlight.vla.lora import LoRASettings, apply_lora, as_lora_settings
from fastlight.vla.retokenize import Retokenizer
from fastlight.vla.value_heads import ActionAwareValueHead
from fastlight.vla.vision import PatchEncoder


class VLAPolicy(PicklableCapture, VLAParts, TokenImitation, PolicyBase):
    """Token-level VLA actor-critic implementing the fastlight policy interface (AcceRL).

    Args:
        backbone: a local VLM or causal-LM folder (:func:`~fastlight.vla.hf_vlm.load_backbone`); its
            tokenizer, if any, re-tokenizes instructions. ``None``: a random Llama of the sizes below.
        action_dim: the env's action dimensions, one action token each.
        n_bins: bins per action dimension = action vocabulary size.
        image_size, patch_size: square image side and patch side of the patch encoder (with a VLM
            backbone: the env's image side; ``patch_size`` unused). ``None``: a state-only policy.
        proprio_dim: proprioceptive state size (0: no proprio token).
        max_text_len: longest instruction ``L`` accepted.
        max_episode_steps: size of the value head's step embedding (longer steps are clamped).
        decoding: ``"parallel"`` or ``"autoregressive"`` (:mod:`fastlight.vla.decoding`).
        prune_head: prune the ``lm_head`` to the ``n_bins`` action rows (AcceRL).
        vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
            tie_word_embeddings: the Llama built when ``backbone is None``.
        value_mlp_hidden: hidden width of the value head's MLP.
        temperature: ``act`` samples and ``act`` / ``evaluate`` score actions under ``softmax(logits /
            temperature)``; ``forward`` (SFT cross-entropy) and argmax actions do not depend on it.
        action_chunk: env actions per call (OpenVLA-OFT's chunks): ``K = action_chunk x action_dim``
            tokens, step-major, mapped to env actions ``[N, action_chunk, action_dim]``.
        lora: LoRA adapters on the backbone's language model (:class:`~fastlight.vla.lora.LoRASettings`
            or a mapping of its fields; :mod:`fastlight.vla.lora`). ``None``: full fine-tuning.
        freeze_vision: a VLM backbone's vision tower gets no gradients and stays in eval mode.
        action_token_ids: ``[first, last)`` of the action tokens, ``last - first == n_bins`` (``None``: the
            last ``n_bins`` ids of the vocabulary, OpenVLA's convention).
        trust_remote_code: let a backbone folder that ships its own code (``auto_map``) run it.
    """

    def __init__(
        self,
        backbone: str | None = None,
        action_dim: int = 4,
        n_bins: int = 256,
        image_size: int | None = 64,
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
        action_chunk: int = 1,
        lora: LoRASettings | None = None,
        freeze_vision: bool = True,
        action_token_ids: list[int] | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"--model.policy.init_args.temperature must be > 0, got {temperature}")
        if not (isinstance(action_chunk, int) and action_chunk >= 1):
            raise ValueError(
                f"--model.policy.init_args.action_chunk must be an int >= 1, got {action_chunk!r}"
            )
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
        self.lora = as_lora_settings(lora)  # checked before the backbone is loaded
        #: env actions per call, and ``K = action_chunk x action_dim`` action tokens per call.
        self.action_chunk, self.num_action_tokens = action_chunk, action_chunk * action_dim
        self.trust_remote_code = bool(trust_remote_code)
        if backbone is None:
            sizes = (vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size)
            self.backbone, self.is_vlm = build_llama(*sizes, tie_word_embeddings), False
        else:  # fp32 weights whatever the folder's dtype (Adam's small steps round away on bf16 weights)
            model, self.is_vlm = load_backbone(backbone, self.trust_remote_code)
            self.backbone = model.float()
        text_cfg = self.backbone.config.get_text_config()
        hidden = int(text_cfg.hidden_size)
        self.action_tokenizer = action_tokenizer(int(text_cfg.vocab_size), n_bins, action_token_ids)
        fit_head(self.backbone, self.action_tokenizer, prune_head)
        if self.lora is not None:  # after the head is pruned: the adapters never touch it
            apply_lora(self.backbone, self.lora)
        args = (backbone, self.is_vlm, image_size, patch_size, hidden, freeze_vision, trust_remote_code)
        encoder = image_encoder(self.backbone, *args)
        self.image_size, self.freeze_vision = image_size, bool(freeze_vision)
        self.vision: PatchEncoder | None = encoder.vision
        self.image_processor = encoder.processor  # a VLM folder's; None otherwise
        for module in encoder.frozen:
            module.requires_grad_(False)
        names = {id(m): n for n, m in self.named_modules()}  # frozen ones stay in eval mode (train())
        self._frozen_modules: tuple[str, ...] = tuple(names[id(m)] for m in encoder.frozen)
        self.proprio_proj = nn.Linear(proprio_dim, hidden) if proprio_dim > 0 else None
        #: Instruction re-tokenization with the folder's tokenizer (a table bound by bind_instructions).
        self.retokenizer = Retokenizer(backbone)
        self.train()  # from_pretrained returns eval mode; train() keeps a frozen tower in eval
        self.action_queries = nn.Parameter(torch.randn(self.num_action_tokens, hidden) * 0.02)
        self.value_head = ActionAwareValueHead(hidden, max_episode_steps, value_mlp_hidden)

    # ------------------------------------------------------------------ construction
    def train(self, mode: bool = True) -> VLAPolicy:
        """Train / eval mode of every submodule, except that frozen ones (``freeze_vision``) stay in eval."""
        super().train(mode)
        for name in getattr(self, "_frozen_modules", ()):
            self.get_submodule(name).eval()
        return self

    @property
    def frozen_modules(self) -> tuple[str, ...]:
        """Names of the frozen submodules :meth:`train` keeps in eval mode (a VLM's vision tower with
        ``freeze_vision``; tower and projector with ``image_size=None``)."""
        return self._frozen_modules

    # ------------------------------------------------------------------ instructions
    def bind_instructions(self, sentences: Sequence[str], ids: Tensor, mask: Tensor) -> bool:
        """Learn the env's instructions: its distinct rows ``ids`` / ``mask`` ``[T, L]`` and their
        ``sentences`` (T), tokenized once with the backbone folder's tokenizer (without one the env's ids
        are the model's). Returns whether a table was bound."""
        rows = self.backbone.get_input_embeddings().weight.shape[0]
        return self.retokenizer.bind(sentences, ids, mask, vocab_rows=rows, device=self.action_queries.device)

    # ------------------------------------------------------------------ sequence building
    def _embed_dtype(self) -> torch.dtype:
        return self.backbone.get_input_embeddings().weight.dtype

    def _prefix(self, obs: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Observation dict -> prefix embeddings ``[N, S0, H]``, mask ``[N, S0]`` (long) and position ids
        ``[N, S0]`` (``[3, N, S0]`` with multimodal RoPE, :func:`~fastlight.vla.hf_vlm.position_ids`)."""
        ids, mask = instruction_inputs(obs, self.max_text_len)
        n, dev, dtype = ids.shape[0], ids.device, self._embed_dtype()
        parts, masks, grid = [], [], None
        if "image" in obs:
            img, grid = image_tokens(
                self.backbone, self.vision, self.image_processor, self.image_size, obs["image"]
            )
            img = img.to(dtype)
            if img.shape[0] != n:
                raise ValueError(
                    f"image batch {tuple(obs['image'].shape)} != instruction_ids {tuple(ids.shape)}"
                )
            parts.append(img)
            masks.append(torch.ones(n, img.shape[1], dtype=torch.long, device=dev))
        prop = proprio_input(obs, n, self.proprio_dim)
        if prop is not None:  # one token [N, 1, H]
            parts.append(self.proprio_proj(prop.to(self.proprio_proj.weight.dtype)).unsqueeze(1).to(dtype))
            masks.append(torch.ones(n, 1, dtype=torch.long, device=prop.device))
        ids, mask = self.retokenizer(ids.long(), mask.long())
        parts.append(self.backbone.get_input_embeddings()(ids))
        masks.append(mask)
        mask = torch.cat(masks, dim=1)  # parts[0] is the image's where the processor gave a grid
        return torch.cat(parts, dim=1), mask, position_ids(self.backbone, mask, parts[0].shape[1], grid)

    def _slots(self, n: int, actions: Tensor | None) -> Tensor:
        """Action-slot embeddings: the K placeholders ``[N, K, H]``, or (autoregressive, bins ``actions``
        ``[N, k]``) the first placeholder then embeddings of ``a_0 .. a_{k-1}``, ``[N, min(k + 1, K), H]``."""
        q = self.action_queries.to(self._embed_dtype()).unsqueeze(0).expand(n, -1, -1)
        if actions is None:
            return q
        embed = self.backbone.get_input_embeddings()
        prev = embed(actions[:, : self.num_action_tokens - 1] + self.action_tokenizer.first_id)
        return torch.cat([q[:, :1], prev], dim=1)

    # ------------------------------------------------------------------ forward passes
    def _hidden(self, prefix: tuple[Tensor, Tensor, Tensor], slots: Tensor) -> Tensor:
        """Last-layer hidden states at the slots: ``[N, S0, H] + [N, k, H] -> [N, k, H]``."""
        emb, mask, pos = prefix
        k = slots.shape[1]
        emb = torch.cat([emb, slots], dim=1)
        mask = torch.cat([mask, mask.new_ones(slots.shape[:2])], dim=1)
        # Slot j follows the prefix's last position (in every multimodal-RoPE section) at + 1 + j.
        after = pos.amax(dim=-1, keepdim=True) + torch.arange(1, k + 1, device=pos.device)
        position_ids = torch.cat([pos, after], dim=-1)
        out = self.backbone.get_decoder()(inputs_embeds=emb, attention_mask=mask, position_ids=position_ids)
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
        """Action logits ``[N, K, n_bins]`` and slot hidden states ``[N, K, H]``; autoregressive decoding
        teacher-forces the bins ``actions [N, K]`` (``None``: placeholders), parallel ignores them."""
        prefix = self._prefix(obs)
        n = prefix[0].shape[0]
        use = actions if self.decoding == "autoregressive" else None
        hidden = self._hidden(prefix, self._slots(n, use))
        return self._logits(hidden), hidden

    # ------------------------------------------------------------------ policy interface
    def act(
        self, obs: dict[str, Tensor], *, step: Tensor | None = None, deterministic: bool = False
    ) -> ActOutput:
        """Sample bins ``[N, K]`` (argmax if ``deterministic``), token logprobs ``[N, K]``, values ``[N]``."""
        prefix = self._prefix(obs)
        n = prefix[0].shape[0]
        step = episode_step(step, n, prefix[0].device)
        hidden = self._hidden(prefix, self._slots(n, None))
        values = self.value_head(hidden, step)
        logits = self._tempered(self._logits(hidden))
        if self.decoding == "parallel":
            actions = choose(logits, deterministic)
            return ActOutput(actions, token_logprobs(logits, actions), values)
        chosen, logps = [], []
        step_logits = logits[:, :1]  # slot 0 is the placeholder in both modes
        for k in range(self.num_action_tokens):
            if k > 0:  # slots 0..k: the placeholder, then the k tokens chosen so far
                slots = self._slots(n, torch.stack(chosen, 1))
                step_logits = self._tempered(self._logits(self._hidden(prefix, slots)[:, -1:]))
            a_k = choose(step_logits, deterministic)  # [N, 1]
            chosen.append(a_k[:, 0])
            logps.append(token_logprobs(step_logits, a_k)[:, 0])
        return ActOutput(torch.stack(chosen, 1), torch.stack(logps, 1), values)

    def evaluate(self, obs: dict[str, Tensor], actions: Tensor, *, step: Tensor | None = None) -> EvalOutput:
        """Token logprobs ``[N, K]``, entropies ``[N, K]`` and values ``[N]`` of bins ``actions [N, K]``."""
        prefix = self._prefix(obs)
        n = prefix[0].shape[0]
        actions = action_bins(actions, n, self.action_chunk, self.action_dim)
        step = episode_step(step, n, prefix[0].device)
        if self.decoding == "parallel":
            hidden = self._hidden(prefix, self._slots(n, None))
            logits, value_hidden = self._logits(hidden), hidden
        else:
            logits = self._logits(self._hidden(prefix, self._slots(n, actions)))
            with torch.no_grad():
                value_hidden = self._hidden(prefix, self._slots(n, None))
        logits = self._tempered(logits)
        entropy = Categorical(logits=logits).entropy()
        return EvalOutput(token_logprobs(logits, actions), entropy, self.value_head(value_hidden, step))

    def value(self, obs: dict[str, Tensor], *, step: Tensor | None = None) -> Tensor:
        """Critic only: values ``[N]``; the backbone runs under ``no_grad``, the value head keeps its
        gradients (AcceRL value recomputation)."""
        with torch.no_grad():
            prefix = self._prefix(obs)
            n = prefix[0].shape[0]
            hidden = self._hidden(prefix, self._slots(n, None))
        return self.value_head(hidden, episode_step(step, n, hidden.device))

    # ------------------------------------------------------------------ actions for the env
    def bins_to_env_action(self, bins: Tensor) -> Tensor:
        """Bins ``[N, K]`` -> float actions in ``[-1, 1]`` (bin centres): ``[N, action_dim]``, or
        ``[N, action_chunk, action_dim]`` with ``action_chunk > 1``."""
        return self.action_mapping()(bins)

    def action_mapping(self) -> ActionMapping:
        """Bins -> bin centres in ``[-1, 1]``, without the backbone (chunked with ``action_chunk > 1``)."""
        bins = BinsToActions(self.action_tokenizer)
        return bins if self.action_chunk == 1 else ChunkActions(bins, self.action_chunk)
