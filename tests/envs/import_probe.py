"""``ImportProbe``: an env wrapper whose envs record which large modules their process has imported.

    fastlight fit ... --data.env_wrappers '[{class_path: tests.envs.import_probe.ImportProbe,
                                             init_args: {dir: DIR}}]'

At every reset and step, each process whose envs reset (the samplers, and the trainer, whose probe
env resets once) writes ``DIR/<pid>.json``, ``{"heavy": [...], "steps": n}``, at its first reset and
whenever the list of :data:`HEAVY` modules in its ``sys.modules`` has changed since its last write.
(``tests/envs/test_sampler_imports.py`` reads them.)
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym

from fastlight.envs.wrappers import EnvWrapper

#: What a process that only steps Meta-World envs must not import: the VLA's stack (transformers
#: and what it pulls in: the Hugging Face hub, PIL; accelerate, sympy and peft with a model).
#: scipy is not here: Meta-World's own envs import ``scipy.spatial.transform`` (and call it each step).
HEAVY = ("transformers", "peft", "PIL", "sympy", "accelerate", "huggingface_hub", "safetensors")

_SEEN: list[str] | None = None  # this process's last written list (None: nothing written yet)
_LOCK = threading.Lock()  # the Collector resets envs on a thread pool


def heavy_imports() -> list[str]:
    return [m for m in HEAVY if m in sys.modules]


class ImportProbe(EnvWrapper):
    def __init__(self, dir: str) -> None:
        self.dir = dir

    def wrap(self, env: gym.Env) -> gym.Env:
        return _ProbeEnv(env, self.dir)


class _ProbeEnv(gym.Wrapper):
    def __init__(self, env: gym.Env, dir: str) -> None:
        super().__init__(env)
        self._dir, self._steps = dir, 0

    def reset(self, **kwargs: Any):
        out = self.env.reset(**kwargs)
        self._record()
        return out

    def step(self, action: Any):
        out = self.env.step(action)
        self._steps += 1
        self._record()
        return out

    def _record(self) -> None:
        global _SEEN
        heavy = heavy_imports()
        with _LOCK:
            if _SEEN is not None and heavy == _SEEN:
                return
            _SEEN = heavy
            path = Path(self._dir) / f"{os.getpid()}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"heavy": heavy, "steps": self._steps}))
            tmp.replace(path)  # a reader never sees half a file
