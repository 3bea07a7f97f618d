"""Offscreen MuJoCo rendering that is safe with several envs and threads in one process.

The OpenGL backend is MuJoCo's ``MUJOCO_GL`` environment variable, which the library never sets
(the ``fastlight`` command, the Makefile and the test suite set ``egl``). Left unset, MuJoCo tries
GLFW, whose failure on a headless machine surfaces only at the first frame:
:func:`require_gl_backend` turns that into an early error that names the variable.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from fastlight.extras import import_extra

#: Serialises offscreen rendering in a process: an OpenGL context is current in one thread at
#: a time, and every Meta-World env owns its own context.
GL_LOCK = threading.RLock()


def require_gl_backend(owner: str) -> None:
    """Raise ``RuntimeError`` if ``MUJOCO_GL`` is unset (``owner`` names what wants to render)."""
    if not os.environ.get("MUJOCO_GL"):
        raise RuntimeError(
            f"{owner} renders offscreen with MuJoCo: set MUJOCO_GL=egl (or osmesa) before importing "
            "mujoco (the `fastlight` command and `make` set egl). Unset, MuJoCo tries GLFW, which "
            "needs a display."
        )


def render_offscreen(env: Any) -> np.ndarray:
    """One ``rgb_array`` frame of a MuJoCo env, safe with several envs and threads per process.

    gymnasium's MuJoCo renderer makes its context current only when it creates it, so with
    several envs in one process a frame would be drawn with another env's context, and a frame
    asked for in a thread other than the creating one (the Collector resets envs on a thread
    pool) comes back black. Here each frame makes its env's context current and (EGL) releases
    it afterwards, under one process-wide lock.
    """
    renderer = env.mujoco_renderer
    with GL_LOCK:
        viewer = renderer._get_viewer("rgb_array")
        viewer.make_context_current()
        try:
            return renderer.render("rgb_array")
        finally:
            _release_gl_context(viewer.backend)


def _release_gl_context(backend: str | None) -> None:
    """Detach the calling thread's current EGL context, so another thread may make it current."""
    if backend != "egl":
        return
    egl = import_extra("mujoco.egl", extra="metaworld", what="MuJoCo EGL rendering")

    if egl.EGL_DISPLAY is not None:
        egl.EGL.eglMakeCurrent(
            egl.EGL_DISPLAY, egl.EGL.EGL_NO_SURFACE, egl.EGL.EGL_NO_SURFACE, egl.EGL.EGL_NO_CONTEXT
        )
