"""The Collector's settings: the reset modes (FAST §DPSA), what a non-finite env value does, and the one
check of them, whose errors name the CLI flag and the allowed values."""

from __future__ import annotations

from typing import Literal, get_args

from fastlight.sampling.auto_threshold import AUTO

#: How a fleet of envs resets (FAST §DPSA); the CLI refuses any other value.
ResetMode = Literal["dpsa", "sgr", "autoreset", "sequential"]
#: What a NaN / inf observation or reward from an env does.
Nonfinite = Literal["raise", "drop"]
RESET_MODES: tuple[str, ...] = get_args(ResetMode)
NONFINITE: tuple[str, ...] = get_args(Nonfinite)


def check_collector_settings(
    *,
    mode: str,
    num_envs: int,
    termination_threshold: float | str,
    max_horizon: int,
    rollout_steps: int,
    nonfinite: str = "raise",
    prefix: str = "--data.",
) -> None:
    """Validate collector settings; errors name the CLI flag and the allowed values."""
    if mode not in RESET_MODES:
        raise ValueError(f"{prefix}reset_mode must be one of {' | '.join(RESET_MODES)}, got {mode!r}")
    if num_envs < 1:
        raise ValueError(f"{prefix}num_envs must be >= 1, got {num_envs}")
    if mode == "sequential" and num_envs != 1:
        raise ValueError(f"{prefix}num_envs must be 1 with {prefix}reset_mode sequential, got {num_envs}")
    if termination_threshold != AUTO and not (
        isinstance(termination_threshold, (int, float)) and 0.0 <= termination_threshold <= 1.0
    ):
        raise ValueError(
            f"{prefix}termination_threshold must be in [0, 1] or {AUTO}, got {termination_threshold!r}"
        )
    if max_horizon < 1:
        raise ValueError(f"{prefix}max_horizon must be >= 1, got {max_horizon}")
    if rollout_steps < 1:
        raise ValueError(f"{prefix}rollout_steps must be >= 1, got {rollout_steps}")
    if nonfinite not in NONFINITE:
        raise ValueError(f"{prefix}nonfinite must be one of {' | '.join(NONFINITE)}, got {nonfinite!r}")
