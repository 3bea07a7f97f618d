"""Sampling: the collector, sampler processes, the pool of a rank, and its fault settings."""

from fastlight.sampling.faults import FaultSettings

__all__ = ["FaultSettings"]
