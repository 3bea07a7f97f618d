"""One Meta-World simulation per task and process, shared by every :class:`MetaWorldEnv` there.

A process builds one :class:`TaskSim` (a Meta-World object and its compiled MuJoCo model) per task and
render settings, on first use, and keeps it while an env that has played the task is open. Each env
keeps only its own *state* of the task it plays (a :class:`SimState`):

- its own ``MjData`` (a bitwise copy of the freshly built one: the whole simulation state);
- a deep copy of the freshly built object's Python attributes (goal, step counter, RNG...), its
  views into the ``MjData`` re-made as views into the state's own;
- its own values of the model arrays Meta-World rewrites at each reset (:data:`STATE_MODEL_FIELDS`).

Using a state (:meth:`TaskSim.use`) swaps it into the shared object: the object's ``__dict__``
becomes the state's, the renderer is pointed at the state's ``MjData``, and the rewritten model
arrays are saved from the state going out and loaded from the one coming in, so a state evolves
bitwise as a Meta-World object of its own would. An env that switches task (at a reset) starts the
new one from a fresh state: a Meta-World v3 reset sets everything a later step reads.

A state is only read or changed inside ``use``, under the task's lock, so envs may be reset and
stepped from any threads; a dropped state used again raises, and an attribute that views memory
other than the ``MjData``'s or the model's stops the state's creation. A forked child forgets the
parent's simulations (their OpenGL contexts do not survive a fork).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import ctypes.util
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from fastlight.envs.metaworld_tasks import import_metaworld
from fastlight.envs.rendering import GL_LOCK

#: Model arrays Meta-World rewrites while it resets a task (``model.body(...).pos``,
#: ``model.site("goal").pos``, the mocap welds' ``eq_data``), plus the other per-element poses:
#: each state keeps its own values of these; every other model array is the same for all states.
STATE_MODEL_FIELDS = ("body_pos", "body_quat", "site_pos", "site_quat", "geom_pos", "geom_quat", "eq_data")


class SimKey(NamedTuple):
    """What makes two Meta-World objects interchangeable: the task and how it renders."""

    task: str
    render_mode: str | None
    camera_name: str | None
    size: int
    fast_render: bool


@dataclass(eq=False)
class SimState:
    """One env's state of one task's simulation (see the module docstring)."""

    sim: TaskSim
    attrs: dict[str, Any]
    data: Any  # mujoco.MjData
    model_fields: dict[str, np.ndarray] = field(default_factory=dict)
    dropped: bool = False


class TaskSim:
    """One Meta-World env object (one MuJoCo model, one renderer) and the states that use it.

    ``private=True`` is one env's own object with one state, the object's own attributes and data
    (nothing copied): one object per env and task, the reference the tests compare against.
    """

    def __init__(self, key: SimKey, *, private: bool = False) -> None:
        metaworld = import_metaworld()

        self.key, self.private = key, private
        cls = metaworld.ALL_V3_ENVIRONMENTS[key.task]
        if key.render_mode is None and not private:
            cls = _textureless(cls)
        with GL_LOCK:  # MuJoCo model compilation, kept out of concurrent renders
            size = key.size
            env = cls(render_mode=key.render_mode, camera_name=key.camera_name, width=size, height=size)
        if key.fast_render:  # before the first render creates the GL context
            env.model.vis.quality.shadowsize = 0
            env.model.vis.quality.offsamples = 0
        self.env = env
        self.lock = threading.RLock()
        self.owner: SimState | None = None
        self.users = 0  # envs holding this simulation (acquire / release)
        self.states = 0  # states made of it
        # The freshly built object's: every shared state starts from a copy (never swapped in).
        self._fresh_attrs = env.__dict__
        self._fresh_data = env.data
        self._fresh_fields = {name: getattr(env.model, name).copy() for name in STATE_MODEL_FIELDS}
        # Where its attributes that view MuJoCo memory lie (None: in the shared model), for the copies.
        self._views = {
            name: self._locate(name, value)
            for name, value in self._fresh_attrs.items()
            if isinstance(value, np.ndarray) and _external(value)
        }
        env.__dict__ = dict(env.__dict__)  # the object's own dict from here on is a throwaway

    def new_state(self) -> SimState:
        """A state as a newly built Meta-World object has it (the private sim's: the object's own)."""
        fields = {name: value.copy() for name, value in self._fresh_fields.items()}
        with self.lock:
            self.states += 1
            if self.private and self.states > 1:
                raise RuntimeError(f"a private Meta-World sim of {self.key.task} has one state")
        if self.private:
            return SimState(self, self._fresh_attrs, self._fresh_data, fields)
        data = copy.copy(self._fresh_data)  # MjData.__copy__: mj_copyData, bitwise
        model = self.env.model
        memo: dict[int, Any] = {id(model): model, id(self._fresh_data): data}
        renderer = self._fresh_attrs.get("mujoco_renderer")
        if renderer is not None:
            memo[id(renderer)] = renderer  # one renderer (and GL context) per task, re-pointed in use()
        for name, where in self._views.items():
            view = self._fresh_attrs[name]
            if where is None:
                memo[id(view)] = view
            else:
                base = getattr(data, where[0])
                memo[id(view)] = np.ndarray(
                    view.shape, view.dtype, buffer=base, offset=where[1], strides=view.strides
                )
        attrs = copy.deepcopy(self._fresh_attrs, memo)
        return SimState(self, attrs, data, fields)

    def _locate(self, name: str, view: np.ndarray) -> tuple[str, int] | None:
        """Where ``view`` lies: ``(MjData field, byte offset)``, or None inside the model."""
        for source in (self._fresh_data, self.env.model):
            for field_name, arr in _arrays(source):
                if not np.may_share_memory(view, arr):
                    continue
                offset = view.__array_interface__["data"][0] - arr.__array_interface__["data"][0]
                if offset < 0 or offset + _extent(view) > arr.nbytes:
                    continue  # overlaps the field without lying inside it
                return None if source is self.env.model else (field_name, offset)
        raise RuntimeError(
            f"Meta-World {self.key.task}: attribute {name!r} views memory that is neither its MjData's "
            "nor its model's; fastlight cannot give each env its own copy of it"
        )

    @contextlib.contextmanager
    def use(self, state: SimState) -> Iterator[Any]:
        """The Meta-World object with ``state`` swapped in, held under the task's lock."""
        with self.lock:
            if state.dropped or state.sim is not self:
                raise RuntimeError(f"Meta-World {self.key.task}: a dropped or foreign state was used")
            if self.owner is not state:
                self._swap_in(state)
            yield self.env

    def _swap_in(self, state: SimState) -> None:
        model, out = self.env.model, self.owner
        for name in STATE_MODEL_FIELDS:
            arr = getattr(model, name)
            if out is not None:
                np.copyto(out.model_fields[name], arr)
            np.copyto(arr, state.model_fields[name])
        self.env.__dict__ = state.attrs
        renderer = state.attrs.get("mujoco_renderer")
        if renderer is not None:  # it draws whichever MjData it points at
            renderer.data = state.data
            for viewer in renderer._viewers.values():
                viewer.data = state.data
        self.owner = state

    def drop(self, state: SimState) -> None:
        """``state`` is no longer used (its env switched task or closed)."""
        with self.lock:
            state.dropped = True
            if self.owner is state:
                self.owner = None
        state.attrs, state.data = {}, None  # its MjData is freed now (or, if it was in, at the next swap)
        _trim_heap()


_TEXTURELESS: dict[type, type] = {}


def _textureless(cls: type) -> type:
    """The Meta-World class ``cls`` compiling its model without textures, for state-only envs.

    Only rendering reads textures (through materials): every other model array is the same
    (``tests/envs/test_metaworld.py`` compares them). A subclass, so Meta-World's ``isinstance``
    check of its task data still holds; it keeps the class's name (Meta-World's ``task_name``).
    """
    sub = _TEXTURELESS.get(cls)
    if sub is None:

        def _initialize_simulation(self: Any) -> tuple[Any, Any]:
            import mujoco

            spec = mujoco.MjSpec.from_file(self.fullpath)
            for texture in list(spec.textures):
                texture.delete()
            for material in spec.materials:
                material.textures = [""] * len(material.textures)
            model = spec.compile()
            return model, mujoco.MjData(model)  # no offscreen buffer size: it never renders

        attrs = {"_initialize_simulation": _initialize_simulation, "__module__": cls.__module__}
        sub = _TEXTURELESS[cls] = type(cls.__name__, (cls,), attrs)
    return sub


def _external(arr: np.ndarray) -> bool:
    """Whether ``arr``'s memory belongs to something other than numpy (MuJoCo's buffers)."""
    while isinstance(arr, np.ndarray) and arr.base is not None:
        arr = arr.base
    return not isinstance(arr, np.ndarray)


def _extent(view: np.ndarray) -> int:
    """Bytes from ``view``'s first element to the end of its last (non-negative strides)."""
    if any(st < 0 for st in view.strides):
        return 1 << 62  # never placed: such a view is not Meta-World's
    return sum((n - 1) * st for n, st in zip(view.shape, view.strides, strict=True)) + view.itemsize


def _arrays(obj: Any) -> Iterator[tuple[str, np.ndarray]]:
    for name in dir(obj):
        if name.startswith("_"):
            continue
        try:
            value = getattr(obj, name)
        except Exception:  # noqa: BLE001 (some MuJoCo attributes raise when read)
            continue
        if isinstance(value, np.ndarray) and value.size:
            yield name, value


_SIMS: dict[SimKey, TaskSim] = {}
_LOCK = threading.Lock()
_BUILT = [0]  # TaskSims (MuJoCo models) built by this process, shared or private


def acquire(key: SimKey, *, share: bool = True) -> TaskSim:
    """The task's simulation for one more env: the process's shared one (built on first use), or
    with ``share=False`` a private one of its own."""
    with _LOCK:
        sim = _SIMS.get(key) if share else None
        if sim is None:
            sim = TaskSim(key, private=not share)
            _BUILT[0] += 1
            if share:
                _SIMS[key] = sim
            _trim_heap()
        sim.users += 1
        return sim


def release(sim: TaskSim) -> None:
    """One env less holds ``sim``; the last one closes it (its model is freed)."""
    with _LOCK:
        sim.users -= 1
        if sim.users:
            return
        if _SIMS.get(sim.key) is sim:
            del _SIMS[sim.key]
    with sim.lock, GL_LOCK:
        sim.env.close()


def _trim_heap() -> None:
    """Return freed heap to the OS (glibc keeps a model compilation's scratch memory otherwise)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _load_libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


_LIBC = _load_libc()


def _forget_after_fork() -> None:
    global _LOCK
    _SIMS.clear()
    _LOCK = threading.Lock()  # a lock held by another thread at the fork would never be released
    _BUILT[0] = 0


os.register_at_fork(after_in_child=_forget_after_fork)
