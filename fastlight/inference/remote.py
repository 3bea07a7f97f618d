"""The sampler side of the inference worker: a policy proxy and the worker's weight version.

A sampler served by the inference worker (:mod:`fastlight.inference.server`) holds a
:class:`RemotePolicy` instead of a policy copy: ``act`` / ``value`` write observation rows into the
sampler's shared-memory slot, send a tiny request over its pipe and read the answer back.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch
from torch import Tensor, nn

from fastlight.inference.server import Answer, Slot, by_key, rows_of
from fastlight.models.base import ActionMapping, ActOutput

#: How often a sampler waiting on the worker's answer beats its heartbeat (s).
WAIT_BEAT_S = 0.5


def _no_beat() -> None:
    pass


class ServedProxy(nn.Module, ABC):
    """What every sampler-side proxy of an inference worker shares (a
    :class:`~fastlight.models.base.ServedPolicy`): ``last_version``, the version of the weights behind
    the latest reply; ``progress``, env rows asked for this round (stragglers are served first);
    ``action_mapping``, the served policy's own. Subclasses implement :meth:`_serve`."""

    #: What a failure names.
    worker = "inference worker"

    def __init__(self, action_mapping: ActionMapping) -> None:
        super().__init__()
        self.last_version = -1
        self.last_checksum = math.nan  # the worker's delivery checksum of last_version's weights
        self.progress = 0
        self._action_mapping = action_mapping
        self.beat: Callable[[], None] = _no_beat

    def new_round(self, beat: Callable[[], None]) -> None:
        self.progress = 0
        self.beat = beat  # the sampler's heartbeat, beaten while an answer is awaited

    def action_mapping(self) -> ActionMapping:
        return self._action_mapping

    def env_action(self, actions: Tensor) -> Tensor:
        return self._action_mapping(actions)

    def evaluate(self, obs, actions, *, step=None):
        raise NotImplementedError(
            f"{type(self).__name__} only acts: log-probs with gradients are computed by the trainer's policy"
        )

    def act(self, obs, *, step=None, deterministic: bool = False) -> ActOutput:
        return ActOutput(*self._request("act", obs, step))

    def value(self, obs, *, step=None) -> Tensor:
        return self._request("value", obs, step)[2]

    def _request(self, kind: str, obs: Tensor | dict[str, Tensor], step: Tensor | None) -> Answer:
        rows = rows_of(obs)
        self.progress += rows
        step = step if step is not None else torch.zeros(rows, dtype=torch.long)
        reply = self._serve(kind, obs, step)
        if isinstance(reply[0], str):  # ("error", traceback)
            raise RuntimeError(f"{self.worker} failed:\n{reply[1]}")
        *answer, version, checksum = reply
        self.last_version, self.last_checksum = int(version), float(checksum)
        return tuple(answer)  # type: ignore[return-value]

    @abstractmethod
    def _serve(self, kind: str, obs: Tensor | dict[str, Tensor], step: Tensor) -> tuple:
        """``(actions, logprobs, values, version, checksum)`` (``(None, None, values, ...)`` for
        ``value``) for ``obs``'s rows, or ``("error", traceback)`` when the worker failed."""


class RemotePolicy(ServedProxy):
    """The local inference worker's proxy: observation rows go through the sampler's shared-memory
    slot, a tiny request and the reply ``(version, checksum)`` over its pipe."""

    def __init__(self, slot: Slot, conn: Connection, action_mapping: ActionMapping) -> None:
        super().__init__(action_mapping)
        self.slot, self.conn = slot, conn

    def _serve(self, kind: str, obs: Tensor | dict[str, Tensor], step: Tensor) -> tuple:
        s, n = self.slot, rows_of(obs)
        for k, v in by_key(obs).items():
            s.obs[k][:n].copy_(v)
        s.step[:n].copy_(step)
        self.conn.send((kind, n, self.progress))
        # Waiting on the worker is not a hang of this sampler: it beats, so a hung worker is the one named.
        while not self.conn.poll(WAIT_BEAT_S):
            self.beat()
        reply = self.conn.recv()
        if isinstance(reply[0], str):  # ("error", traceback)
            return reply
        acted = (s.actions[:n].clone(), s.logprobs[:n].clone()) if kind == "act" else (None, None)
        return *acted, s.values[:n].clone(), *reply


class ServerVersion:
    """Sampler-side view of the inference worker's weight version (nothing to load)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    @property
    def version(self) -> int:
        return int(self.value.value)

    def load_into(self, policy: nn.Module) -> int:
        return self.version
