"""An env that reports, on every reset, the process's imported modules and memory.

``--data.env_id tests.probe_env:ModulesProbe-v0`` builds it inside each sampler process: it
wraps a real ``highway-fast-v0`` and writes ``{"modules": [...], "VmRSS": MB, "RssAnon": MB}`` to
``<report_dir>/<pid>.json`` (``report_dir`` in ``env_kwargs``), so a test can see what a sampler
process loaded and how much memory it holds once it has sampled.
"""

from __future__ import annotations

import json
import os
import sys

import gymnasium as gym


def _memory_mb() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "RssAnon"):
                out[key] = int(line.split()[1]) / 1024
    return out


class ModulesProbe(gym.Wrapper):
    def __init__(self, report_dir: str, inner: str = "highway-fast-v0") -> None:
        from fastlight.envs.registry import make_env

        super().__init__(make_env(inner))
        self.report_dir = report_dir

    def reset(self, **kwargs):
        out = super().reset(**kwargs)
        path = os.path.join(self.report_dir, f"{os.getpid()}.json")
        tmp = f"{path}.{id(self)}.tmp"  # the envs of one sampler may reset in parallel threads
        with open(tmp, "w") as f:
            json.dump({"modules": sorted(sys.modules), **_memory_mb()}, f)
        os.replace(tmp, path)  # a reader never sees half a report
        return out


gym.register("ModulesProbe-v0", entry_point=ModulesProbe)
