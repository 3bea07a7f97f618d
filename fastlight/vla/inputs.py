"""The inputs a :class:`~fastlight.vla.policy.VLAPolicy` accepts, checked before any forward: each gets a
one-line ``ValueError`` naming the key, the shape expected and the shape given; :class:`VLAParts` holds
the env check and parameter groups both VLA policies share.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn


def instruction_inputs(obs: dict[str, Tensor], max_text_len: int) -> tuple[Tensor, Tensor]:
    """``(instruction_ids, instruction_mask)`` ``[N, L]`` of ``obs``; the mask is all ones when absent."""
    if not isinstance(obs, dict) or "instruction_ids" not in obs:
        raise ValueError("VLAPolicy obs must be a dict with 'instruction_ids' [N, L] (and optional keys)")
    ids = obs["instruction_ids"]
    if ids.dim() != 2 or ids.shape[1] > max_text_len or ids.is_floating_point():
        raise ValueError(
            f"instruction_ids must be integer [N, L<=max_text_len={max_text_len}], "
            f"got {tuple(ids.shape)} {ids.dtype}"
        )
    mask = obs.get("instruction_mask")
    mask = torch.ones_like(ids) if mask is None else mask
    if mask.shape != ids.shape:
        raise ValueError(f"instruction_mask shape {tuple(mask.shape)} != instruction_ids {tuple(ids.shape)}")
    return ids, mask


def proprio_input(obs: dict[str, Tensor], n: int, proprio_dim: int) -> Tensor | None:
    """``obs['proprio']`` ``[N, proprio_dim]``, or ``None`` with ``proprio_dim == 0`` (the key refused)."""
    if proprio_dim == 0:
        if "proprio" in obs:
            raise ValueError(f"obs has 'proprio' {tuple(obs['proprio'].shape)} but proprio_dim=0")
        return None
    prop = obs.get("proprio")
    if prop is None or prop.shape != (n, proprio_dim):
        got = None if prop is None else tuple(prop.shape)
        raise ValueError(f"proprio must be [N={n}, proprio_dim={proprio_dim}], got {got}")
    return prop


def episode_step(step: Tensor | None, n: int, device: torch.device) -> Tensor:
    """The episode step ``[N]``; zeros when not given."""
    if step is None:
        return torch.zeros(n, dtype=torch.long, device=device)
    if step.shape != (n,):
        raise ValueError(f"step must be [N={n}], got shape {tuple(step.shape)}")
    return step


def action_bins(actions: Tensor, n: int, action_chunk: int, action_dim: int) -> Tensor:
    """Integer bins ``[N, K]``, ``K = action_chunk x action_dim``, as long."""
    k = action_chunk * action_dim
    if actions.shape != (n, k) or actions.is_floating_point():
        raise ValueError(
            f"actions must be integer bins [N={n}, K={k}] (action_chunk {action_chunk} x "
            f"action_dim {action_dim}), got {tuple(actions.shape)}"
        )
    return actions.long()


def check_obs_space(space: gym.Space, p: nn.Module) -> None:
    """Raise ``ValueError`` naming the flag if the env's observation does not fit the policy ``p`` (a
    ``VLAPolicy`` or ``FlowVLAPolicy``)."""
    if not isinstance(space, gym.spaces.Dict) or "instruction_ids" not in space.spaces:
        raise ValueError(
            f"VLAModule needs a dict observation with 'instruction_ids' (e.g. --data.env_id "
            f"fastlight/MetaWorld-reach-v3), got {space}"
        )
    obs, flag = space.spaces, "--model.policy.init_args"
    text_len = obs["instruction_ids"].shape[0]
    if text_len > p.max_text_len:
        raise ValueError(
            f"{flag}.max_text_len={p.max_text_len} is shorter than the env's instructions ({text_len})"
        )
    size, image = p.image_size, obs.get("image")
    if image is not None and size is None:
        raise ValueError(
            f"the env renders images {tuple(image.shape)} but {flag}.image_size=null builds no image "
            f"encoder: set {flag}.image_size={image.shape[0]} (or --data.env_kwargs.image false)"
        )
    if image is None and size is not None:
        # The encoder's parameters would get no gradient: DDP stops on unused parameters.
        raise ValueError(
            f"the env has no 'image' (state only) but {flag}.image_size={size} builds an image encoder it "
            f"would never use: set {flag}.image_size=null"
        )
    if image is not None and tuple(image.shape) != (size, size, 3):
        raise ValueError(f"{flag}.image_size={size} does not match the env's image {tuple(image.shape)}")
    env_proprio = obs["proprio"].shape[0] if "proprio" in obs else 0
    if env_proprio != p.proprio_dim:
        raise ValueError(
            f"{flag}.proprio_dim={p.proprio_dim} does not match the env's proprio size {env_proprio} "
            f"(--data.env_kwargs.proprio_dim)"
        )
    if p.retokenizer.active:  # the folder's tokenizer re-tokenizes the instructions: any env id fits
        return
    high = np.asarray(obs["instruction_ids"].high)
    rows = p.backbone.get_input_embeddings().weight.shape[0]
    top = int(high.max()) if np.isfinite(high).all() else -1
    if top >= rows:
        raise ValueError(
            f"the env's instruction ids go up to {top} but the backbone has {rows} input embeddings: "
            f"set {flag}.vocab_size above {top}, or give a backbone folder with a tokenizer"
        )


class VLAParts:
    """What the VLA policies share: the observation-space check and the actor / critic parameters (the
    critic is the ``value_head``)."""

    def check_obs_space(self, space: object) -> None:
        """Refuse an env whose observations do not fit (:func:`check_obs_space`)."""
        check_obs_space(space, self)

    def policy_parameters(self) -> list[nn.Parameter]:
        """Every parameter except the value head's, frozen ones included (the optimizers skip those)."""
        return [p for n, p in self.named_parameters() if not n.startswith("value_head.")]

    def value_parameters(self) -> list[nn.Parameter]:
        return list(self.value_head.parameters())
