"""A VLA as a user may already have one, written without fastlight: a small transformers decoder
(GPT-2, built from its config) reads ``[state token][instruction tokens]`` and an action head turns
the last real token's hidden state into ``n_bins`` logits per action dimension."""

from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Config, GPT2Model


class MyVLA(nn.Module):
    def __init__(self, state_dim: int, action_dim: int, n_bins: int = 64, vocab_size: int = 128,
                 hidden: int = 64, layers: int = 2, heads: int = 4) -> None:  # fmt: skip
        super().__init__()
        self.action_dim, self.n_bins = action_dim, n_bins
        self.lm = GPT2Model(GPT2Config(vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=heads))
        self.state_in = nn.Linear(state_dim, hidden)
        self.action_head = nn.Linear(hidden, action_dim * n_bins)

    def forward(
        self, state: torch.Tensor, instruction_ids: torch.Tensor, instruction_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``state [N, S]``, right-padded ``instruction_ids`` / ``instruction_mask [N, L]`` ->
        action logits ``[N, action_dim, n_bins]`` and the features they came from ``[N, hidden]``."""
        n = state.shape[0]
        words = self.lm.get_input_embeddings()(instruction_ids)
        x = torch.cat([self.state_in(state).unsqueeze(1), words], dim=1)
        mask = torch.cat([instruction_mask.new_ones(n, 1), instruction_mask], dim=1)
        hidden = self.lm(inputs_embeds=x, attention_mask=mask).last_hidden_state
        features = hidden[torch.arange(n, device=hidden.device), mask.sum(1) - 1]  # the last real token
        return self.action_head(features).view(n, self.action_dim, self.n_bins), features
