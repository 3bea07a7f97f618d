"""The trainer's record of each sampler actor of a :class:`~fastlight.fleet.ray.fleet.RaySamplerFleet`,
and what the fleet makes of a node lost without a word: its raylet dead, it stays ``Alive`` in
``ray.nodes()`` until Ray's health check declares it dead; until then calls on its actors fail with
``ActorUnavailableError``, which is not a death (a replacement would land in the same bundle, on the
dead node). So the fleet makes the call again, and judges such an actor by its heartbeat only after
:data:`NODE_VERDICT_S`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fastlight.procs import Liveness

#: How long an actor Ray cannot reach is left to Ray's own verdict on its node before its heartbeat
#: judges it (twice what Ray's default health check takes to declare a silent node dead).
NODE_VERDICT_S = 30.0


@dataclass
class ActorRecord:
    """One sampler actor and what the fleet watches of it."""

    index: int
    handle: Any
    created: float
    info_ref: Any
    #: Its heartbeat: the count it sends with every answer (an actor may run on another node).
    liveness: Liveness
    #: (node id, node IP, pid), once it answered ``info``.
    where: tuple[str, str, int] | None = None
    #: Set for a replacement after a node left: (node id, node IP) of the lost node.
    lost_node: tuple[str, str] | None = None
    #: The same, kept until :func:`moved_line` has said where the lost node's samplers went.
    moved_from: tuple[str, str] | None = None
    #: Since when Ray answers its calls with ``ActorUnavailableError`` (none answered since).
    unreachable_since: float | None = None

    def judged(self, now: float) -> bool:
        """Whether its heartbeat may condemn it: not while it is being placed after a node left, nor
        while Ray may still be deciding whether the node it cannot reach is dead."""
        waiting = self.unreachable_since is not None and now - self.unreachable_since <= NODE_VERDICT_S
        return self.lost_node is None and not waiting


def moved_line(lost: tuple[str, str], records: list[ActorRecord], rank: int) -> str | None:
    """Once every replacement for the samplers of node ``lost`` runs somewhere, the line saying which
    node left and where they went (and they are no longer waited for); None until then."""
    moved = [r for r in records if r.moved_from == lost]
    placed = [(r.index, r.where) for r in moved if r.where is not None]
    if len(placed) < len(moved):
        return None
    went: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for index, (node, ip, pid) in placed:
        went.setdefault((node, ip), []).append((index, pid))
    for r in moved:
        r.moved_from = None
    where = " and ".join(
        f"Ray node {node} ({ip}) (samplers {_ints(i for i, _ in on)}; pids {_ints(p for _, p in on)})"
        for (node, ip), on in went.items()
    )
    return (
        f"Ray node {lost[0]} ({lost[1]}) left the cluster; its samplers {_ints(r.index for r in moved)} "
        f"of rank {rank} now run on {where}"
    )


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _ints(values: Iterable[int]) -> str:
    return ", ".join(map(str, values))
