"""``FlowVLAPolicy``: a flow-matching VLA (pi0) trained by RL through flow-SDE (πRL, arXiv 2510.25889).

transformers' ``PI0ForConditionalGeneration`` from a local folder reads the observation dict of
:mod:`fastlight.vla.policy` (``proprio`` is pi0's zero-padded state). The prefix runs once per call and
is cached; the action expert denoises a chunk ``[C, M]`` in ``K`` Euler steps, of which one random step
(``sde_steps="one"``) or every step is the flow-SDE's Gaussian transition (:mod:`fastlight.vla.flow_sde`).
``actions`` ``[N, H*D + 1 + S*C*M]``: the executed chunk (step-major, clipped to ``[-1, 1]``), the first
stochastic step ``k`` and the states the learner scores again (``x_k, x_{k+1}``, or the whole chain).
``logprobs`` / ``entropy`` ``[N, H*D]``: the Gaussian log-densities / entropies of the stochastic
step(s), summed over steps, per executed entry. Values: AcceRL's value head on the expert's detached
state token (it sees the prefix and the state, not the noisy chunk).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from fastlight.extras import import_extra
from fastlight.losses.masked import masked_mean
from fastlight.models.action_mapping import ChunkActions
from fastlight.models.base import ActionMapping, ActOutput, EvalOutput, Obs, PolicyBase
from fastlight.vla.flow_sde import gaussian_entropy, gaussian_logprob, sde_times, sde_transition
from fastlight.vla.hf_vlm import BACKBONE_FLAG, PicklableCapture
from fastlight.vla.image_encoder import image_encoder, image_tokens
from fastlight.vla.inputs import VLAParts, episode_step, instruction_inputs, proprio_input
from fastlight.vla.lora import LoRASettings, apply_lora, as_lora_settings
from fastlight.vla.pi05 import Pi05Prompt, is_pi05, pi05_expert, pi05_flow_loss, pi05_prefix
from fastlight.vla.retokenize import Retokenizer
from fastlight.vla.value_heads import ActionAwareValueHead

FLAG = "--model.policy.init_args"
SDE_STEPS = ("one", "all")


def build_pi0(
    vocab: int, hidden: int, layers: int, chunk: int, action_dim: int, state_dim: int, *, pi05: bool = False
) -> nn.Module:
    """A random tiny ``PI0ForConditionalGeneration`` (PaliGemma with SigLIP 32x32, a Gemma expert of the
    same depth and heads); ``pi05``: a ``PI05ForConditionalGeneration`` of the same sizes."""
    t = import_extra("transformers", extra="vla", what="the flow VLA policy")
    sizes = {"hidden_size": hidden, "intermediate_size": 2 * hidden, "num_attention_heads": 2}
    text = {**sizes, "vocab_size": vocab, "num_hidden_layers": layers, "num_key_value_heads": 1,
            "head_dim": hidden // 2}  # fmt: skip
    vision = t.SiglipVisionConfig(**sizes, num_hidden_layers=1, image_size=32, patch_size=8)
    vlm = t.PaliGemmaConfig(vision_config=vision, text_config=t.GemmaConfig(**text), projection_dim=hidden,
                            hidden_size=hidden, vocab_size=vocab, image_token_index=vocab)  # fmt: skip
    if pi05:
        config = t.PI05Config(vlm_config=vlm, dit_config=t.GemmaConfig(**text), chunk_size=chunk,
                              max_action_dim=action_dim)  # fmt: skip
        return t.PI05ForConditionalGeneration(config)
    config = t.PI0Config(vlm_config=vlm, dit_config=t.GemmaConfig(**text), chunk_size=chunk,
                         max_action_dim=action_dim, max_state_dim=max(state_dim, 1))  # fmt: skip
    return t.PI0ForConditionalGeneration(config)


def load_pi0(path: str) -> nn.Module:
    """``PI0ForConditionalGeneration`` or ``PI05ForConditionalGeneration`` (:mod:`fastlight.vla.pi05`) of the
    local folder ``path``; anything else refused in one line."""
    t = import_extra("transformers", extra="vla", what="the flow VLA policy")
    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"{BACKBONE_FLAG} {path}: not a local model folder (no config.json there)")
    config = t.AutoConfig.from_pretrained(path)
    classes = {"PI0Config": "PI0ForConditionalGeneration", "PI05Config": "PI05ForConditionalGeneration"}
    if type(config).__name__ not in classes:
        raise ValueError(
            f"{BACKBONE_FLAG} {path}: its config is a {type(config).__name__}, not a PI0Config or "
            "PI05Config: FlowVLAPolicy loads pi0 and pi0.5 folders; use --model.policy.class_path "
            "fastlight.vla.policy.VLAPolicy for this one"
        )
    # fp32 weights whatever the folder's dtype (as VLAPolicy's): --trainer.precision computes
    return getattr(t, classes[type(config).__name__]).from_pretrained(path).float()


@dataclass(frozen=True)
class ExecutedChunk:
    """Packed flow actions ``[N, W]`` -> the executed chunk's entries ``[N, width]`` (the first
    ``width`` columns), clipped to ``[-bound, bound]``; picklable, without the policy."""

    width: int
    bound: float = 1.0

    def __call__(self, actions: Tensor) -> Tensor:
        return actions[..., : self.width].clamp(-self.bound, self.bound)


class FlowVLAPolicy(PicklableCapture, VLAParts, PolicyBase):
    """pi0 actor-critic over flow-SDE chains (πRL), implementing :class:`~fastlight.models.base.FlowPolicy`.

    Args:
        backbone: a local pi0 / pi0.5 folder; ``None``: :func:`build_pi0` with the size settings below.
        action_dim: ``D``, the env's action size (``<=`` the model's ``max_action_dim``).
        action_chunk: ``H``, env steps executed per call (``<=`` the model's ``chunk_size``).
        num_steps: ``K``, Euler steps of the denoising chain.
        sde_steps: ``"one"`` (one uniformly drawn step per sample is stochastic) or ``"all"``.
        sde_logprob: with ``sde_steps="all"``, the chain's log-likelihood per entry is the ``"sum"`` of its
            ``K`` steps' log-densities (the joint density) or their ``"mean"`` (RLinf's joint mode).
        train_padding: SFT also trains the chunk steps past ``H`` and the action dims past ``D`` toward
            their zero action (openpi's way); ``False`` masks them out.
        noise_level: the flow-SDE's ``a`` in ``sigma_k = a sqrt(t_k / (1 - t_k))`` (> 0).
        proprio_dim: the env's proprio size, pi0's state (``<=`` the model's ``max_state_dim``).
        max_text_len, max_episode_steps, value_mlp_hidden: as :class:`~fastlight.vla.policy.VLAPolicy`.
        image_size: the env's image side; ``None``: state and instruction only.
        freeze_vision: the vision tower gets no gradients.
        lora: LoRA adapters (:mod:`fastlight.vla.lora`) on the VLM's language model and on the expert.
    """

    def __init__(
        self,
        backbone: str | None = None,
        action_dim: int = 4,
        action_chunk: int = 1,
        num_steps: int = 10,
        sde_steps: Literal["one", "all"] = "one",
        sde_logprob: Literal["sum", "mean"] = "sum",
        noise_level: float = 0.5,
        proprio_dim: int = 0,
        max_text_len: int = 16,
        max_episode_steps: int = 500,
        value_mlp_hidden: int = 256,
        image_size: int | None = None,
        freeze_vision: bool = True,
        lora: LoRASettings | None = None,
        vocab_size: int = 512,
        hidden_size: int = 32,
        num_hidden_layers: int = 2,
        train_padding: bool = True,
    ) -> None:
        super().__init__()
        for name, value, low in (("action_dim", action_dim, 1), ("action_chunk", action_chunk, 1),
                                 ("num_steps", num_steps, 1), ("proprio_dim", proprio_dim, 0),
                                 ("max_text_len", max_text_len, 1)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{FLAG}.{name} must be an int >= {low}, got {value!r}")
        if sde_steps not in SDE_STEPS:
            raise ValueError(f"{FLAG}.sde_steps must be one of {', '.join(SDE_STEPS)}, got {sde_steps!r}")
        if sde_logprob not in ("sum", "mean"):
            raise ValueError(f"{FLAG}.sde_logprob must be sum or mean, got {sde_logprob!r}")
        if not noise_level > 0:
            raise ValueError(f"{FLAG}.noise_level must be > 0 (the SDE noise scale), got {noise_level}")
        if backbone is None and image_size is not None:
            raise ValueError(f"{FLAG}.image_size needs {BACKBONE_FLAG} (a pi0 folder, its image processor)")
        self.action_dim, self.action_chunk, self.proprio_dim = action_dim, action_chunk, proprio_dim
        self.num_steps, self.sde_steps, self.noise_level = num_steps, sde_steps, float(noise_level)
        self.max_text_len, self.train_padding = max_text_len, bool(train_padding)
        self.logprob_steps = num_steps if sde_steps == "all" and sde_logprob == "mean" else 1
        self.lora = as_lora_settings(lora)
        sizes = (vocab_size, hidden_size, num_hidden_layers, action_chunk, action_dim, proprio_dim)
        self.backbone = build_pi0(*sizes) if backbone is None else load_pi0(backbone)
        cfg = self.backbone.config
        self.pi05 = is_pi05(cfg)  # what differs: fastlight.vla.pi05
        if self.pi05 and image_size is not None:
            raise ValueError(f"{FLAG}.image_size: image mode is not supported for pi0.5 folders yet "
                             "(state and instruction only: image_size null)")  # fmt: skip
        limits = [("action_chunk", action_chunk, "chunk_size", cfg.chunk_size),
                  ("action_dim", action_dim, "max_action_dim", cfg.max_action_dim)]  # fmt: skip
        if not self.pi05:  # pi0.5 reads the state as text: any size
            limits.append(("proprio_dim", proprio_dim, "max_state_dim", cfg.max_state_dim))
        for name, value, what, most in limits:
            if value > most:
                raise ValueError(f"{FLAG}.{name}={value} exceeds the pi0 model's {what}={most}")
        cfg.loss_reduction = "none"  # flow_matching_loss masks the padded chunk steps and dims itself
        self.chunk_shape = (cfg.chunk_size, cfg.max_action_dim)
        #: States stored per call: ``x_k, x_{k+1}``, or the whole chain.
        self.stored_states = num_steps + 1 if sde_steps == "all" else 2
        vlm = self.backbone.model.vlm
        encoder = image_encoder(vlm, backbone, True, image_size, 1, 1, freeze_vision)
        self.image_size, self.image_processor = image_size, encoder.processor
        if self.lora is not None:  # the VLM's language model and the expert; heads and projections train
            apply_lora(vlm, self.lora)
            apply_lora(self.backbone.model.dit, self.lora)
        # Frozen as they feed nothing (DDP stops on trainable parameters without gradients): the prefix
        # is read through its cached keys / values only, so the VLM's last layer past them and its norm.
        lm = vlm.get_decoder()
        last = lm.layers[-1]
        attention = last.self_attn
        unused = [attention.q_proj, attention.o_proj, last.mlp, last.post_attention_layernorm, lm.norm]
        if not self.pi05:  # pi0.5's expert has no token embeddings
            unused.append(self.backbone.model.dit.get_input_embeddings())
        for module in [*encoder.frozen, *unused]:
            module.requires_grad_(False)
        self.retokenizer = Retokenizer(backbone)
        self.prompt = Pi05Prompt(backbone) if self.pi05 else None
        # The critic reads pi0's state token in the expert, pi0.5's prompt end in the VLM.
        hidden = cfg.vlm_config.text_config.hidden_size if self.pi05 else cfg.dit_config.hidden_size
        self.value_head = ActionAwareValueHead(hidden, max_episode_steps, value_mlp_hidden)
        self.train()  # from_pretrained returns eval mode

    def bind_instructions(self, sentences: Any, ids: Tensor, mask: Tensor) -> bool:
        """As :meth:`fastlight.vla.policy.VLAPolicy.bind_instructions`: the folder's tokenizer, once."""
        rows = self.backbone.get_input_embeddings().weight.shape[0]
        device = self.value_head.score.weight.device
        if self.prompt is not None:
            self.prompt.sentences = [str(s) for s in sentences]
        return self.retokenizer.bind(sentences, ids, mask, vocab_rows=rows, device=device)

    # ------------------------------------------------------------------ forward pieces
    def _prefix(self, obs: dict[str, Tensor]) -> tuple[Any, Tensor, Tensor]:
        """Observation -> (the VLM's key/value cache of the prefix, its mask ``[N, S0]``, the state
        ``[N, max_state_dim]`` in the backbone's dtype), as pi0's ``sample_actions`` builds them."""
        if self.pi05:
            return pi05_prefix(self, obs)
        ids, mask = instruction_inputs(obs, self.max_text_len)
        ids, mask = self.retokenizer(ids.long(), mask.long())
        vlm = self.backbone.model.vlm
        emb = vlm.get_input_embeddings()(ids)
        if "image" in obs:
            img, _ = image_tokens(vlm, None, self.image_processor, self.image_size, obs["image"])
            img = img.to(emb.dtype)
            emb, mask = torch.cat([img, emb], 1), torch.cat([mask.new_ones(img.shape[:2]), mask], 1)
        cache = vlm(inputs_embeds=emb, attention_mask=mask, position_ids=mask.cumsum(1) - 1,
                    token_type_ids=torch.zeros_like(mask), use_cache=True).cache  # fmt: skip
        n = ids.shape[0]
        state = emb.new_zeros(n, self.backbone.config.max_state_dim)
        prop = proprio_input(obs, n, self.proprio_dim)
        if prop is not None:
            state[:, : self.proprio_dim] = prop.to(state.dtype)
        return cache, mask, state

    def _expert(self, prefix: tuple[Any, Tensor, Tensor], x: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """One velocity: chain states ``x [N, C, M]`` at steps ``k [N]`` -> (``v [N, C, M]`` float32, the
        state token's last hidden state ``[N, 1, H_expert]``). The cache is cropped back to the prefix."""
        if self.pi05:
            return pi05_expert(self, prefix, x, k)
        cache, mask, state = prefix
        length = cache.get_seq_length()
        t = sde_times(self.num_steps, x.device)[k]
        emb = self.backbone.embed_action_time(state, x.to(state.dtype), t)
        hidden = self.backbone.model(action_embeds=emb, attention_mask=mask, cache=cache).last_hidden_state
        cache.crop(length - cache.get_seq_length())  # drop this step's keys: the next sees the prefix only
        return self.backbone.action_out_proj(hidden[:, 1:]).float(), hidden[:, :1]

    def _executed(self, x: Tensor) -> Tensor:
        """``[N, C, M]`` -> the executed entries ``[N, H*D]`` (step-major)."""
        return x[:, : self.action_chunk, : self.action_dim].reshape(x.shape[0], -1)

    def _unpack(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Packed actions -> first stochastic step ``k [N]`` and stored states ``[N, S, C, M]``."""
        n, hd = actions.shape[0], self.action_chunk * self.action_dim
        width = hd + 1 + self.stored_states * self.chunk_shape[0] * self.chunk_shape[1]
        if actions.shape != (n, width) or not actions.is_floating_point():
            raise ValueError(
                f"FlowVLAPolicy actions must be its packed float chains [N, {width}] (H*D={hd} + 1 + "
                f"{self.stored_states} states x {self.chunk_shape}), got {tuple(actions.shape)} "
                f"{actions.dtype}"
            )
        return actions[:, hd].long(), actions[:, hd + 1 :].reshape(n, self.stored_states, *self.chunk_shape)

    # ------------------------------------------------------------------ policy interface
    @torch.no_grad()
    def act(
        self, obs: dict[str, Tensor], *, step: Tensor | None = None, deterministic: bool = False
    ) -> ActOutput:
        """Run the chain: packed actions ``[N, W]``, logprobs ``[N, H*D]``, values ``[N]``. ``deterministic``:
        every step is the ODE's (from random noise ``x_0``, as πRL evaluates)."""
        prefix = self._prefix(obs)
        n, dev = prefix[1].shape[0], prefix[1].device
        every = self.sde_steps == "all"
        first = torch.randint(1 if every else self.num_steps, (n,), device=dev)  # the first stochastic step
        x = torch.randn(n, *self.chunk_shape, device=dev)
        chain, logp = [x], x.new_zeros(n, *self.chunk_shape)
        for j in range(self.num_steps):
            k = torch.full((n,), j, dtype=torch.long, device=dev)
            v, hidden = self._expert(prefix, x, k)
            if j == 0:
                values = self.value_head(hidden, episode_step(step, n, dev))
            mean, std = sde_transition(x, v, k, self.num_steps, self.noise_level)
            noisy = (k == first)[:, None, None] | every
            ode = x - v / self.num_steps
            x = torch.where(noisy & (not deterministic), mean + std * torch.randn_like(x), ode)
            logp = logp + torch.where(noisy, gaussian_logprob(x, mean, std), 0.0)
            chain.append(x)
        chain = torch.stack(chain, 1)  # [N, K + 1, C, M]
        if not every:
            chain = chain[torch.arange(n, device=dev)[:, None], first[:, None] + torch.arange(2, device=dev)]
        packed = torch.cat([self._executed(x), first[:, None].float(), chain.flatten(1)], 1)
        return ActOutput(packed, self._executed(logp) / self.logprob_steps, values)

    def evaluate(self, obs: dict[str, Tensor], actions: Tensor, *, step: Tensor | None = None) -> EvalOutput:
        """Log-densities ``[N, H*D]`` of the stored chain's stochastic step(s) and values ``[N]``. The
        "entropy" ``[N, H*D]`` is the SDE noise's, a constant of the schedule (no use as a bonus)."""
        prefix = self._prefix(obs)
        first, states = self._unpack(actions)
        logp = ent = 0.0
        for j in range(states.shape[1] - 1):
            v, hidden = self._expert(prefix, states[:, j], first + j)
            if j == 0:
                values = self.value_head(hidden, episode_step(step, first.shape[0], first.device))
            mean, std = sde_transition(states[:, j], v, first + j, self.num_steps, self.noise_level)
            logp = logp + gaussian_logprob(states[:, j + 1], mean, std)
            ent = ent + gaussian_entropy(std).expand_as(mean)
        k = self.logprob_steps
        return EvalOutput(self._executed(logp) / k, self._executed(ent) / k, values)

    def value(self, obs: dict[str, Tensor], *, step: Tensor | None = None) -> Tensor:
        """Critic only: the state token's hidden state does not depend on the chain, so any state does."""
        with torch.no_grad():
            prefix = self._prefix(obs)
            n = prefix[1].shape[0]
            zeros = prefix[2].new_zeros(n, *self.chunk_shape).float()
            _, hidden = self._expert(prefix, zeros, torch.zeros(n, dtype=torch.long, device=zeros.device))
        return self.value_head(hidden, episode_step(step, n, hidden.device))

    def flow_matching_loss(
        self, obs: dict[str, Tensor], actions: Tensor, valid: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """pi0's own training loss (Beta-sampled time, velocity MSE) on continuous actions ``[N, H*D]``
        (step-major), mean over the valid entries (``valid`` ``[N]`` or ``[N, H*D]``) and, with
        ``train_padding``, the padding of every sample with a valid entry. Returns ``(loss, {})``."""
        cache, mask, state = self._prefix(obs)
        n = state.shape[0]
        if actions.shape != (n, self.action_chunk * self.action_dim):
            raise ValueError(
                f"flow_matching_loss: actions must be [N={n}, H*D={self.action_chunk * self.action_dim}], "
                f"got {tuple(actions.shape)}"
            )
        target = state.new_zeros(n, *self.chunk_shape)
        target[:, : self.action_chunk, : self.action_dim] = actions.reshape(n, self.action_chunk, -1)
        if self.pi05:
            loss = pi05_flow_loss(self, (cache, mask, state), target)
        else:
            loss = self.backbone(state=state, actions=target, attention_mask=mask, cache=cache).loss
        keep = torch.ones_like(actions, dtype=torch.bool) if valid is None else valid.bool()
        keep = keep.expand_as(actions) if keep.dim() == 2 else keep[:, None].expand_as(actions)
        h, d = self.action_chunk, self.action_dim
        grid = keep.new_full(loss.shape, self.train_padding) & keep.any(1)[:, None, None]
        grid[:, :h, :d] = keep.reshape(n, h, d)
        return masked_mean(loss.float(), grid), {}

    def imitation_loss(
        self, obs: Obs, actions: Tensor, valid: Tensor | None = None, *, own: bool = False, **_: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`flow_matching_loss` of continuous actions, or (``own``) its chains' executed chunk."""
        return self.flow_matching_loss(obs, (self.env_action(actions) if own else actions).flatten(1), valid)

    def action_mapping(self) -> ActionMapping:
        """Packed actions -> the executed chunk in [-1, 1]: ``[N, H, D]`` (``[N, D]`` for ``H = 1``)."""
        executed = ExecutedChunk(self.action_chunk * self.action_dim)
        return executed if self.action_chunk == 1 else ChunkActions(executed, self.action_chunk)
