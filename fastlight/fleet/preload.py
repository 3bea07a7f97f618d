"""Imported by the forkserver of :func:`fastlight.fleet.start.warm_forkserver`: the sampler's
modules, and the package that registers the run's env id, so forked samplers start with them
loaded. Only those: a forked child maps everything its server imported, so a module preloaded
for a rarer child (the inference worker) would sit in every sampler. Nothing here may raise: a
forkserver that fails to preload would fail every sampler, while a missing module only costs the
sampler its own import (which then reports the real error)."""

from __future__ import annotations

import os

try:
    import fastlight.sampling.worker  # noqa: F401  (torch, gymnasium, the Collector)
    from fastlight.envs.registry import check_env_id
    from fastlight.fleet.start import PRELOAD_ENV_VAR

    _env_id = os.environ.get(PRELOAD_ENV_VAR)
    if _env_id:
        check_env_id(_env_id)  # imports highway_env (or the module before ':') and checks the id
except Exception:  # noqa: BLE001
    pass
