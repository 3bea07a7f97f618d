"""π0.5 in :class:`~fastlight.vla.flow_policy.FlowVLAPolicy`: what differs from π0, in one place.

transformers' ``PI05ForConditionalGeneration`` (LeRobot's π0.5 checkpoints) keeps π0's flow-matching
expert but (a) reads the robot state as text, discretised into 256 bins in the prompt
(``<bos>Task: {instruction}, State: {b_1 b_2 ...};\nAction: ``, as its ``PI05Processor`` writes it), and
(b) feeds the denoising time through adaptive RMS norms (adaRMS) instead of a state token. So the critic,
having no state token, reads the VLM's hidden state at the prompt's last token. The state is clipped to
``[-1, 1]`` before binning. Image mode is not supported yet.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fastlight.vla.flow_sde import sde_times
from fastlight.vla.hf_vlm import load_tokenizer
from fastlight.vla.inputs import instruction_inputs, proprio_input
from fastlight.vla.retokenize import match_rows

#: State bins of π0.5's prompt (its processor's ``torch.linspace(-1, 1, 257)[:-1]``).
STATE_BINS = 256


def is_pi05(config: Any) -> bool:
    """Whether a loaded model's config is a π0.5 one."""
    return type(config).__name__ == "PI05Config"


def state_text(state: Tensor) -> list[str]:
    """``state [N, S]`` -> each row's bins ``"b_1 b_2 ..."`` (``PI05Processor.build_prompts``'s)."""
    edges = torch.linspace(-1, 1, STATE_BINS + 1)[:-1]
    bins = torch.bucketize(state.detach().float().cpu().clamp(-1, 1), edges, right=True) - 1
    return [" ".join(map(str, row.tolist())) for row in bins]


class Pi05Prompt:
    """Builds and tokenizes π0.5 prompts; picklable (the tokenizer is loaded where it is first used)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sentences: list[str] = []
        self._tokenizer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "sentences": self.sentences, "_tokenizer": None}

    def prompts(self, tasks: list[str], state: Tensor | None) -> list[str]:
        texts = [""] * len(tasks) if state is None else [f", State: {s}" for s in state_text(state)]
        bos = self.tokenizer.bos_token or ""
        tasks = [t.strip().replace("_", " ").replace("\n", " ") for t in tasks]  # as the processor does
        return [f"{bos}Task: {t}{s};\nAction: " for t, s in zip(tasks, texts, strict=True)]

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.path)
        return self._tokenizer

    def encode(self, prompts: list[str], device: torch.device) -> tuple[Tensor, Tensor]:
        """Right-padded ``(ids, mask)`` ``[N, L]`` (the BOS is in the text)."""
        out = self.tokenizer(prompts, padding=True, add_special_tokens=False, return_tensors="pt")
        return out["input_ids"].to(device), out["attention_mask"].to(device)


def pi05_prefix(policy: nn.Module, obs: dict[str, Tensor]) -> tuple[Any, Tensor, Tensor]:
    """``(the prompt's key/value cache, its mask [N, L], the critic's input [N, 1, H_vlm])``."""
    ids, mask = instruction_inputs(obs, policy.max_text_len)
    table = policy.retokenizer.row_keys
    if table is None or not policy.prompt.sentences:
        raise ValueError("a pi0.5 policy builds its prompt from the env's instructions: bind them first")
    rows = match_rows(ids, mask, table).tolist()
    n, device = ids.shape[0], ids.device
    prop = proprio_input(obs, n, policy.proprio_dim)
    prompts = policy.prompt.prompts([policy.prompt.sentences[i] for i in rows], prop)
    ids, mask = policy.prompt.encode(prompts, device)
    vlm = policy.backbone.model.vlm
    out = vlm(input_ids=ids, attention_mask=mask, position_ids=mask.cumsum(1) - 1,
              token_type_ids=torch.zeros_like(mask), use_cache=True)  # fmt: skip
    last = (mask.sum(1) - 1).clamp(min=0)
    summary = out.last_hidden_state[torch.arange(n, device=device), last][:, None]
    return out.cache, mask, summary


def pi05_expert(
    policy: nn.Module, prefix: tuple[Any, Tensor, Tensor], x: Tensor, k: Tensor
) -> tuple[Tensor, Tensor]:
    """One velocity ``[N, C, M]`` (float32) at chain states ``x`` and steps ``k``, and the critic's input."""
    cache, mask, summary = prefix
    length = cache.get_seq_length()
    t = sde_times(policy.num_steps, x.device)[k]
    backbone = policy.backbone
    action_embeds, time_embeds = backbone.embed_action_time(x.to(backbone.dtype), t)
    hidden = backbone.model(action_embeds=action_embeds, timestep_embeds=time_embeds, attention_mask=mask,
                            cache=cache).last_hidden_state  # fmt: skip
    cache.crop(length - cache.get_seq_length())  # the next step sees the prompt only
    return backbone.action_out_proj(hidden).float(), summary


def pi05_flow_loss(policy: nn.Module, prefix: tuple[Any, Tensor, Tensor], target: Tensor) -> Tensor:
    """π0.5's own flow-matching loss ``[N, C, M]`` of ``target`` chunks (its Beta-sampled time)."""
    cache, mask, _ = prefix
    noise = torch.randn_like(target)
    return policy.backbone(noise=noise, actions=target, attention_mask=mask, cache=cache).loss
