"""Policy objectives as typed objects: ``--model.objective GIPO --model.objective.sigma 0.2``.

Each objective wraps a pure loss of :mod:`fastlight.losses` and holds its own settings (jsonargparse
refuses ``--model.objective.sigma`` with ``PPOClip``). A new objective subclasses :class:`Objective` and
implements :meth:`Objective.loss`; the ratio granularity is ``RLModule``'s, passed in.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from fastlight.class_paths import class_path, resolve
from fastlight.losses import gipo_loss, ppo_clip_loss, sapo_loss

__all__ = ["GIPO", "SAPO", "Objective", "PPOClip", "as_objective"]

_FLAG = "--model.objective.init_args"


class Objective(ABC):
    """A policy objective: ``(policy loss, detached diagnostics)`` of one minibatch.

    Subclasses keep their settings as attributes named like their ``__init__`` parameters (what
    :meth:`init_args` reads) and implement :meth:`loss`, whose diagnostics should hold ``approx_kl`` and
    ``clip_frac`` (logged as ``loss/*``).
    """

    @abstractmethod
    def loss(
        self,
        *,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        valid: Tensor,
        granularity: str,
        tokens_per_action: int,
        count: Tensor | float | None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The SMPO-reduced policy loss and its detached diagnostics.

        Shapes as :func:`fastlight.losses.ppo.ppo_clip_loss`: log-probs ``[N]`` or ``[N, K]``,
        ``advantages [N]`` (or per token), ``valid [N]`` bool; ``count`` the DDP denominator.
        """

    def init_args(self) -> dict[str, Any]:
        """The ``__init__`` arguments that rebuild this objective (its config's ``init_args``)."""
        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {name: getattr(self, name) for name in names if hasattr(self, name)}

    def config(self) -> dict[str, Any]:
        """``{"class_path", "init_args"}``: how hparams, checkpoints and YAML spell this objective."""
        return {"class_path": class_path(type(self)), "init_args": self.init_args()}

    @staticmethod
    def _positive(name: str, value: float) -> None:
        if not value > 0:
            raise ValueError(f"{_FLAG}.{name} must be > 0, got {value}")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.init_args() == self.init_args()

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.init_args().items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.init_args().items())
        return f"{type(self).__name__}({args})"


class PPOClip(Objective):
    """PPO's clipped surrogate (FAST §SMPO masked mean; :func:`~fastlight.losses.ppo.ppo_clip_loss`).

    Args:
        clip_eps: clip range ε of ``clip(r, 1-ε, 1+ε)``; also the ``clip_frac`` threshold.
    """

    def __init__(self, clip_eps: float = 0.2) -> None:
        self._positive("clip_eps", clip_eps)
        self.clip_eps = clip_eps

    def loss(self, **inputs: Any) -> tuple[Tensor, dict[str, Tensor]]:
        return ppo_clip_loss(**inputs, clip_eps=self.clip_eps)


class GIPO(Objective):
    """Gaussian trust-weighted objective (AcceRL §GIPO; :func:`~fastlight.losses.gipo.gipo_loss`).

    Args:
        sigma: trust width σ in log-ratio space (AcceRL sweeps 0.2, 0.5, 1.0).
        clip_frac_eps: only the threshold of the ``clip_frac`` diagnostic; not in the loss.
    """

    def __init__(self, sigma: float = 0.5, clip_frac_eps: float = 0.2) -> None:
        self._positive("sigma", sigma)
        self._positive("clip_frac_eps", clip_frac_eps)
        self.sigma, self.clip_frac_eps = sigma, clip_frac_eps

    def loss(self, **inputs: Any) -> tuple[Tensor, dict[str, Tensor]]:
        return gipo_loss(**inputs, sigma=self.sigma, clip_eps=self.clip_frac_eps)


class SAPO(Objective):
    """Soft-gated objective, AcceRL's SAPO baseline (:func:`~fastlight.losses.sapo.sapo_loss`).

    Args:
        tau_pos: gate temperature for positive advantages.
        tau_neg: gate temperature for negative advantages.
        clip_frac_eps: only the threshold of the ``clip_frac`` diagnostic; not in the loss.
    """

    def __init__(self, tau_pos: float = 1.0, tau_neg: float = 1.05, clip_frac_eps: float = 0.2) -> None:
        for name, value in (("tau_pos", tau_pos), ("tau_neg", tau_neg), ("clip_frac_eps", clip_frac_eps)):
            self._positive(name, value)
        self.tau_pos, self.tau_neg, self.clip_frac_eps = tau_pos, tau_neg, clip_frac_eps

    def loss(self, **inputs: Any) -> tuple[Tensor, dict[str, Tensor]]:
        return sapo_loss(**inputs, tau_pos=self.tau_pos, tau_neg=self.tau_neg, clip_eps=self.clip_frac_eps)


def as_objective(value: Any, default: type[Objective]) -> Objective:
    """``value`` as an Objective: an object, ``None`` (``default()``) or the ``{"class_path",
    "init_args"}`` mapping that hparams and checkpoints hold (:meth:`Objective.config`)."""
    if value is None:
        return default()
    if isinstance(value, Objective):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("class_path"), str):
        cls = resolve(value["class_path"])
        if isinstance(cls, type) and issubclass(cls, Objective):
            return cls(**dict(value.get("init_args") or {}))
    raise TypeError(
        f"--model.objective must be an Objective, e.g. --model.objective GIPO --model.objective.sigma 0.5 "
        f"(one of PPOClip | GIPO | SAPO or your subclass), got {value!r}"
    )
