"""fastlight's benchmarks: ``python -m benchmarks.<study>`` from the repository root (not installed).

Each study writes ``benchmarks/results/<study>.md`` with the exact command that produced it.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root: the folder that holds ``benchmarks/`` (and ``fastlight/``).
REPO_ROOT = Path(__file__).resolve().parent.parent


def child_env(**overrides: str) -> dict[str, str]:
    """``os.environ`` for a ``python -m benchmarks.<module>`` child process, from any working directory.

    ``benchmarks`` is not installed, so the repository root goes first on the child's ``PYTHONPATH``;
    ``overrides`` are set on top (e.g. ``OMP_NUM_THREADS="1"``).
    """
    env = {**os.environ, **overrides}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    return env
