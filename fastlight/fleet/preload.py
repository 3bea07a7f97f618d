"""Imported by the forkserver of :func:`fastlight.fleet.start.warm_forkserver`: the sampler's modules
and the run's env package, and only those (a forked child maps everything its server imported).
Nothing here may raise: a forkserver that fails to preload would fail every sampler."""

from __future__ import annotations

import os

try:
    import fastlight.sampling.worker  # noqa: F401  (torch, gymnasium, the Collector)
    from fastlight.envs.registry import check_env_id
    from fastlight.fleet.start import PRELOAD_ENV_VAR

    if _env_id := os.environ.get(PRELOAD_ENV_VAR):
        check_env_id(_env_id)  # imports highway_env (or the module before ':') and checks the id
except Exception:  # noqa: BLE001
    pass
