"""The Collector's settings: the reset modes as data (FAST §DPSA), what a non-finite env value does, and
the range checks of the sampling settings, one table line per flag naming the values it allows."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from fastlight.sampling.auto_threshold import AUTO

#: How a fleet of envs resets (FAST §DPSA); the CLI refuses any other value. What each one is: RESET_MODES.
ResetMode = Literal["dpsa", "sgr", "autoreset", "sequential"]
#: What a NaN / inf observation or reward from an env does.
Nonfinite = Literal["raise", "drop"]
NONFINITE: tuple[str, ...] = get_args(Nonfinite)


@dataclass(frozen=True)
class ResetTraits:
    """What a reset mode is, as every site that acts on the mode reads it.

    Attributes:
        cycles: a ``collect()`` is one sampling cycle that ends in a unified truncation (a global reset,
            ``max_horizon`` its cap), so its reset can be done ahead; otherwise ``rollout_steps`` steps
            whose episodes carry over to the next call, each env resetting on its own.
        threshold: a cycle is truncated once ``termination_threshold`` of its envs have ended (``auto``
            chooses it); otherwise at the first end.
        shares_rate: a rank's samplers can end their cycles on one termination rate over all their
            clips (``--data.rank_rounds together`` with ``--data.max_staleness 0``,
            :mod:`fastlight.sampling.round_signal`).
        one_env: one env per sampler (``--data.num_envs`` equal to ``--data.num_workers``).
    """

    cycles: bool
    threshold: bool = False
    shares_rate: bool = False
    one_env: bool = False


#: Every :data:`ResetMode` (in its order) and what it is.
RESET_MODES: dict[str, ResetTraits] = {
    "dpsa": ResetTraits(cycles=True, threshold=True, shares_rate=True),
    "sgr": ResetTraits(cycles=True, shares_rate=True),  # Synchronous Global Reset: cut at the first end
    "autoreset": ResetTraits(cycles=False),
    "sequential": ResetTraits(cycles=False, one_env=True),  # the baseline of FAST's speed-up table
}
#: The reset modes whose samplers can share a termination rate, as an error line names them.
RATE_MODES = " or ".join(m for m, t in RESET_MODES.items() if t.shares_rate)

#: A setting's range: a test of its value and what it must be, for the line
#: ``--data.<name> must be <what>, got <value>``.
Range = tuple[Callable[[Any], bool], str]


def _threshold(value: object) -> bool:
    return value == AUTO or (isinstance(value, int | float) and 0.0 <= value <= 1.0)


#: The Collector's settings, in the order they are checked.
COLLECTOR_RANGES: dict[str, Range] = {
    "reset_mode": (lambda v: v in RESET_MODES, "one of " + " | ".join(RESET_MODES)),
    "num_envs": (lambda v: v >= 1, ">= 1"),
    "termination_threshold": (_threshold, f"in [0, 1] or {AUTO}"),
    "max_horizon": (lambda v: v >= 1, ">= 1"),
    "rollout_steps": (lambda v: v >= 1, ">= 1"),
    "nonfinite": (lambda v: v in NONFINITE, "one of " + " | ".join(NONFINITE)),
}


def check_ranges(values: Mapping[str, Any], ranges: Mapping[str, Range]) -> None:
    """Refuse the first of ``values`` outside its range, naming the flag and what it allows."""
    for name, (ok, allowed) in ranges.items():
        if not ok(values[name]):
            raise ValueError(f"--data.{name} must be {allowed}, got {values[name]!r}")
