"""The trainer's side of a rank's samplers: the fleet setting and base, the local process pool, the
forkserver start, and the fault settings both fleets apply. ``fleet/ray/`` holds the Ray fleet."""

from fastlight.fleet.faults import FaultSettings

__all__ = ["FaultSettings"]
