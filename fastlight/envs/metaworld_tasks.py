"""Meta-World task names, the state size, and each task's goal variations (AcceRL §experiments).

AcceRL trains on the MT10 benchmark. :func:`parse_tasks` turns the ``tasks`` setting into v3 task
names; :func:`goal_variations` gives a task's 50 goals, the ones ``metaworld.MT1(name,
seed=goal_seed)`` generates (goal-observable, as in the MT benchmarks), built once per process.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from fastlight.extras import import_extra

#: The MT10 benchmark's tasks, in Meta-World's order.
MT10_TASKS = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
    "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3",
)  # fmt: skip

#: Size of Meta-World's state vector.
STATE_DIM = 39


def parse_tasks(tasks: str | Sequence[str]) -> tuple[str, ...]:
    """``"MT10"``, one task name, a comma-separated string or a list -> task names."""
    if isinstance(tasks, str):
        names = list(MT10_TASKS) if tasks.strip() == "MT10" else [t.strip() for t in tasks.split(",")]
    else:
        names = [str(t) for t in tasks]
    names = [n for n in names if n]
    if not names or len(set(names)) != len(names):
        raise ValueError(
            f"--data.env_kwargs.tasks must name distinct Meta-World tasks or 'MT10', got {tasks!r}"
        )
    metaworld = import_metaworld()

    unknown = [n for n in names if n not in metaworld.ALL_V3_ENVIRONMENTS]
    if unknown:
        raise ValueError(
            f"--data.env_kwargs.tasks: unknown Meta-World v3 task(s) {unknown}; known: "
            f"{sorted(metaworld.ALL_V3_ENVIRONMENTS)} (or 'MT10')"
        )
    return tuple(names)


def import_metaworld() -> Any:
    """The ``metaworld`` package, or one line saying to install the metaworld extra."""
    return import_extra("metaworld", extra="metaworld", what="a Meta-World env (fastlight/MetaWorld-*)")


_GOALS: dict[tuple[str, int], tuple[Any, ...]] = {}
_GOALS_LOCK = threading.Lock()


def goal_variations(name: str, seed: int) -> tuple[Any, ...]:
    """The ``metaworld.Task`` goal variations of task ``name`` (MT1, goal observable), cached.

    Built under a lock: ``metaworld.MT1`` reseeds the global numpy RNG while it draws the goals,
    so two threads building at once (concurrent resets) would corrupt each other's goals.
    """
    metaworld = import_metaworld()

    with _GOALS_LOCK:
        if (name, seed) not in _GOALS:
            _GOALS[(name, seed)] = tuple(metaworld.MT1(name, seed=seed).train_tasks)
        return _GOALS[(name, seed)]
