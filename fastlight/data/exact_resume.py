"""The trainer's half of an exact resume (the samplers' is :mod:`fastlight.sampling.exact`): its RNG
states in the checkpoint, and the one line that says whether a resume is bit for bit, and if not, why.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info

from fastlight.rank_state import gather_per_rank, world
from fastlight.safe_files import key_path, local_mac, signed_here
from fastlight.sampling.exact import SamplerState

#: The DataModule checkpoint entry: per rank, ``{"rng": ..., "samplers": {index: SamplerState}}``.
EXACT_KEY = "exact_resume"


def rng_states() -> dict[str, Any]:
    """The trainer process's generators, as tensors and numbers (checkpoints load ``weights_only``)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: Mapping[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def states_to_plain(states: Mapping[int, SamplerState]) -> dict[int, dict[str, Any]]:
    """Sampler positions as a checkpoint stores them (numbers, a byte tensor and its HMAC: see
    :mod:`fastlight.safe_files`)."""
    return {i: {"version": s.version, "rounds": s.rounds, "resets": s.resets, "exact": s.exact,
                "envs": None if s.envs is None else torch.frombuffer(bytearray(s.envs), dtype=torch.uint8),
                "mac": None if s.envs is None else local_mac(s.envs)}
            for i, s in states.items()}  # fmt: skip


def states_from_plain(plain: Mapping[int, Mapping[str, Any]]) -> tuple[dict[int, SamplerState], list[int]]:
    """``(positions, samplers whose env states were dropped)``: an env state not signed by this user's
    key (another user's checkpoint, a planted one) is never unpickled; its episodes start anew."""
    states, unsigned = {}, []
    for i, p in plain.items():
        envs = None if p["envs"] is None else p["envs"].numpy().tobytes()
        if envs is not None and not signed_here(envs, p.get("mac")):
            envs = None
            unsigned.append(int(i))
        exact = bool(p["exact"]) and int(i) not in unsigned
        states[int(i)] = SamplerState(
            int(p["version"]), int(p["rounds"]), int(p["resets"]), envs=envs, exact=exact
        )
    return states, unsigned


def not_exact(
    hparams: Mapping[str, Any],
    states: Mapping[int, SamplerState],
    *,
    saved_ranks: int | None,
    ranks: int,
    rank_rounds: str,
    local: bool,
    unsigned: Sequence[int] = (),
) -> list[str]:
    """Why a resume with these settings and sampler ``states`` is not exact (empty: it is).
    ``unsigned``: samplers whose saved env states were refused (:func:`states_from_plain`)."""
    why = []
    if saved_ranks is None:
        why.append("the checkpoint holds no RNG states or sampler positions (written by an older fastlight)")
    elif saved_ranks != ranks:
        why.append(f"it was saved by {saved_ranks} trainer rank(s), this run has {ranks}")
    if hparams["max_staleness"] > 0:
        why.append(f"--data.max_staleness {hparams['max_staleness']}: rounds begin while updates land")
    if rank_rounds == "together":
        why.append("--data.rank_rounds together: the samplers end their rounds by each other's progress "
                   "(apart is exact)")  # fmt: skip
    if not local:
        why.append("--data.fleet: samplers on a Ray cluster")
    if hparams["inference"] is not None:
        why.append("--data.inference: one worker answers the samplers in the order they ask")
    if saved_ranks is not None and len(states) != hparams["num_workers"]:
        why.append(f"the checkpoint holds {len(states)} sampler position(s), this run has "
                   f"{hparams['num_workers']} sampler(s)")  # fmt: skip
    if unsigned:
        why.append(f"the env states of samplers {list(unsigned)} were not written by this user's runs "
                   f"(no matching HMAC under {key_path()}); they are pickles and could run code, so they "
                   "are not read and the episodes under way start anew")  # fmt: skip
    lost = sorted(i for i, s in states.items() if not s.exact and i not in unsigned)
    if lost and not hparams["exact_resume"]:
        why.append("--data.exact_resume false: the envs were not saved, so the episodes under way (autoreset "
                   "runs them on across rounds) start anew")  # fmt: skip
    elif lost:
        why.append(f"the state of {hparams['env_id']} cannot be saved (samplers {lost}), so the episodes "
                   "under way start anew")  # fmt: skip
    return why


def save_exact(states: Mapping[int, SamplerState]) -> list[dict[str, Any]]:
    """The checkpoint entry: every rank's RNG states and sampler positions, gathered to rank 0."""
    return gather_per_rank({"rng": rng_states(), "samplers": states_to_plain(states)})


def restore_exact(
    saved: list[dict[str, Any]] | None, hparams: Mapping[str, Any], rank_rounds: str, local: bool
) -> dict[int, SamplerState]:
    """Restore this rank's RNG states from ``saved`` (:func:`save_exact`), say in one line whether
    the resume is exact, and return the sampler positions to resume from."""
    rank, size = world()
    mine = saved[rank] if isinstance(saved, list) and len(saved) == size else None
    states: dict[int, SamplerState] = {}
    unsigned: list[int] = []
    if mine is not None:
        set_rng_states(mine["rng"])
        states, unsigned = states_from_plain(mine["samplers"])
    kw = dict(ranks=size, rank_rounds=rank_rounds, local=local, unsigned=unsigned)
    why = not_exact(hparams, states, saved_ranks=len(saved) if isinstance(saved, list) else None, **kw)
    rank_zero_info(
        "fastlight: resumed as an exact continuation (the trainer's RNG, each sampler's seeds and envs)"
        if not why
        else f"fastlight: resumed, not as an exact continuation: {'; '.join(why)}"
    )
    return states
