"""Float64 fingerprints of a module's weights, to check that two copies hold the same version:
:func:`delivery_checksum`, which every receiver computes after taking a version, and
:class:`DeliveryCheck`, the trainer's comparison of it with what it published.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import NamedTuple

import torch
from torch import nn

from fastlight.weights.buckets import sync_entries
from fastlight.weights.publisher import WeightSyncError

#: Elements of each published tensor a delivery checksum reads: a strided slice of about this many.
SAMPLE = 1024
#: How far two delivery checksums of the same weights may differ, as a fraction of their ``scale``: the
#: ends differ only in summation order (at most n * 2**-53 * scale for n exact float64 terms), far less
#: than an update moves it (about 1e-4 / sqrt(n) of the scale).
REL_TOL = 1e-9


class Checksum(NamedTuple):
    """A delivery checksum: ``value`` and ``scale``, the sum of its terms' magnitudes (the size of the
    rounding two ends may differ by, see :data:`REL_TOL`)."""

    value: float
    scale: float

    def matches(self, value: float) -> bool:
        """Whether a receiver's checksum ``value`` is this one, up to :data:`REL_TOL` of the scale."""
        if math.isnan(value) and math.isnan(self.value):  # NaN weights held at both ends are delivered
            return True
        return value == self.value or abs(value - self.value) <= REL_TOL * self.scale


def delivery_checksum(module: nn.Module) -> Checksum:
    """A cheap float64 fingerprint, on the module's own device, of what a publish carries
    (:func:`~fastlight.weights.buckets.sync_entries`): every tensor counts, through a strided slice of
    about :data:`SAMPLE` elements (an optimizer step moves every element); element ``j`` of tensor ``i``
    is weighted by ``(i + 1) * (j + 1)``, so tensors or elements out of place change it. Tensors are read
    in the dtype they travel in, so both ends sample the same numbers."""
    with torch.no_grad():
        entries = [(i, t) for i, (_, t) in enumerate(sync_entries(module)) if t.numel()]
        if not entries:  # nothing published (a fixed policy): nothing to compare
            return Checksum(0.0, 0.0)
        device = entries[0][1].device
        samples = [_strided_sample(t) for _, t in entries]
        if any(s.device != device for s in samples):  # a module spread over devices: gather the samples
            samples = [s.to(device) for s in samples]
        key = tuple((i + 1, s.numel()) for (i, _), s in zip(entries, samples, strict=True))
        terms = torch.cat(samples).to(torch.float64) * _position_weights(key, device)
        value, scale = torch.stack([terms.sum(), terms.abs().sum()]).tolist()
    return Checksum(value, scale)


def _strided_sample(t: torch.Tensor) -> torch.Tensor:
    """Every ``numel // SAMPLE``-th element of ``t`` in its flat order (all of a small tensor), a view
    where ``t`` is contiguous."""
    n = t.numel()
    stride = max(1, n // SAMPLE)
    if stride == 1 and t.dim() == 1:
        return t
    if t.is_contiguous():
        return t.as_strided(((n + stride - 1) // stride,), (stride,))
    return t.reshape(-1)[::stride]


@functools.lru_cache(maxsize=8)
def _position_weights(key: tuple[tuple[int, int], ...], device: torch.device) -> torch.Tensor:
    """``(i + 1) * (j + 1)`` for element ``j`` of tensor ``i`` (``key``: ``(i + 1, samples)`` per tensor),
    as float64 on ``device``: the same for every version of one model, so built once per process."""
    weights = [torch.arange(1, n + 1, dtype=torch.float64) * k for k, n in key]
    return torch.cat(weights).to(device)


class DeliveryCheck:
    """The trainer's end of the delivery check (``--data.faults.verify_weights_every``): :meth:`published`
    records, every ``every``-th version (0: never), the :func:`delivery_checksum` of the *live* policy
    right after its publish; :meth:`check` compares the ``(receiver, version, checksum)`` reports that
    come with Rollouts and raises :class:`~fastlight.weights.publisher.WeightSyncError` on a mismatch. A
    version stays recorded for ``keep`` versions (``--data.max_staleness`` + 1); ``verified`` counts the
    (receiver, version) pairs found to match (``sync/verified``)."""

    def __init__(self, every: int, *, keep: int, setting: str = "verify_weights_every") -> None:
        self.every, self.keep, self.setting = every, keep, setting
        self.expected: dict[int, tuple[Checksum, str]] = {}
        self.verified = 0
        self._seen: set[tuple[str, int]] = set()

    def published(self, policy: nn.Module, version: int, mode: str) -> None:
        """``policy`` (the trainer's live module) was just published as ``version`` through ``mode``."""
        if self.every <= 0 or version % self.every:
            return
        self.expected[version] = (delivery_checksum(policy), mode)
        for old in [v for v in self.expected if v < version - self.keep]:
            del self.expected[old]
        self._seen = {s for s in self._seen if s[1] in self.expected}

    def check(self, held: Iterable[tuple[str, int, float]]) -> None:
        """Compare receivers' reports ``(receiver, version, checksum)`` with what the trainer published."""
        for receiver, version, value in held:
            if (entry := self.expected.get(version)) is None or (receiver, version) in self._seen:
                continue
            want, mode = entry
            if not want.matches(value):
                raise WeightSyncError(
                    f"weights did not arrive: {receiver} holds version {version} with checksum {value!r}, "
                    f"the trainer published {want.value!r} (transport {mode}); the weight path delivered "
                    f"other weights than the trainer's (stale, or partly copied) under a new version number "
                    f"({self.setting} {self.every}: the versions divisible by {self.every} are checked; "
                    "0 turns the check off)"
                )
            self._seen.add((receiver, version))
            self.verified += 1
