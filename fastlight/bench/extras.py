"""The benchmarks' optional packages (``pip install 'fastlight[bench]'``), checked up front.

Training needs none of them; a benchmark or report started without them says which extra to
install instead of failing on an import deep inside.
"""

from __future__ import annotations

import importlib.util

#: Import names (the distribution ``stable-baselines3`` imports as ``stable_baselines3``).
BENCH_PACKAGES = ("matplotlib", "pandas", "scipy", "rliable", "imageio", "stable_baselines3")


def require(*modules: str, command: str) -> None:
    """Raise ``ModuleNotFoundError`` naming the missing ``modules`` and the extra that has them."""
    unknown = [m for m in modules if m not in BENCH_PACKAGES]
    if unknown:
        raise ValueError(f"require: {unknown} are not in the bench extra {BENCH_PACKAGES}")
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(
            f"{command} needs {', '.join(missing)}, from the optional 'bench' extra: "
            "pip install 'fastlight[bench]' (or `make bench`)"
        )
