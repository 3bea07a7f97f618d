"""How fastlight starts its child processes: ``spawn``, or a ``forkserver`` warmed at start-up.

A spawned sampler imports torch, gymnasium and its env package itself (3-4 s of CPU each for
highway-env on a 2-core machine), and it can only start once the trainer has imported Lightning
and parsed the config. The ``fastlight`` command instead starts a forkserver as its very first
step (:func:`warm_forkserver`): a clean single-threaded process that imports the sampler's
modules (and the run's env package, read from the command line or the ``--config`` files) on
the other core *while* the trainer imports Lightning. Samplers are then forked from it with
those modules already loaded. A forkserver child is a fresh process as far as the trainer is
concerned (its arguments are pickled as with spawn, it shares no trainer state, no CUDA, no
threads); its parent is the forkserver, which exits when the trainer does
(:func:`fastlight.procs.die_with_parent` accepts it).

Library use (a user's own script, the tests) keeps ``spawn`` unless it warms a forkserver or
passes ``start_method="forkserver"`` explicitly (``--data.start_method``).

This module imports nothing heavy: it runs before Lightning is imported.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from typing import Any, Literal, get_args

#: How sampler and inference processes start (``None`` picks one, see :func:`resolve_start_method`).
StartMethod = Literal["spawn", "forkserver"]
START_METHODS: tuple[str, ...] = get_args(StartMethod)
#: The forkserver imports these (module :mod:`fastlight.fleet.preload` reads the env id).
PRELOAD = ["fastlight.fleet.preload"]
#: Environment variable through which the forkserver learns the run's env id.
PRELOAD_ENV_VAR = "FASTLIGHT_PRELOAD_ENV_ID"
#: Set for a forkserver started outside the trainer's working directory (see :func:`warm_forkserver`):
#: the directory :mod:`fastlight.fleet.preload` returns to once fastlight is imported.
PRELOAD_CWD_VAR = "FASTLIGHT_PRELOAD_CWD"
#: The fastlight package running here, and the sys.path entry that holds it.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_ROOT = os.path.dirname(PACKAGE_DIR)

_warm = False


def forkserver_available() -> bool:
    import multiprocessing

    return "forkserver" in multiprocessing.get_all_start_methods()


def warm_forkserver(env_id: str | None = None) -> bool:
    """Start the forkserver now, importing the sampler's modules (and ``env_id``'s package) in it.

    Returns False (and changes nothing) where the platform has no forkserver. Later calls are
    no-ops. After it, :func:`resolve_start_method` (``None``) picks ``forkserver``.
    """
    global _warm
    if _warm:
        return True
    if not forkserver_available():
        return False
    import multiprocessing
    import signal
    import threading
    from multiprocessing import forkserver

    if env_id:
        os.environ[PRELOAD_ENV_VAR] = env_id
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    # The forkserver runs `python -c`, so sys.path[0] there is its working directory: one that holds
    # another fastlight/ would be imported in place of this one. It then starts where this fastlight
    # is found, and goes back to the trainer's directory once it has imported it (the env package
    # may be the user's own module there).
    cwd = os.getcwd()
    elsewhere = shadowing_entry([""]) is not None
    # Started with the stop signals ignored (fastlight.procs.STOP_SIGNALS, not imported here: that
    # loads torch, and the forkserver is started first so that it imports on the other core), the
    # forkserver and every child forked from it ignore Ctrl-C, SIGTERM and SIGUSR1 from their first
    # instruction (an ignored disposition survives exec, and Python then installs no KeyboardInterrupt
    # handler): the trainer handles them and stops its children itself. A forkserver killed by a
    # signal to the whole process group would take its samplers with it.
    main_thread = threading.current_thread() is threading.main_thread()
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in stop_signals} if main_thread else {}
    try:
        if elsewhere:
            os.environ[PRELOAD_CWD_VAR] = cwd
            os.chdir(PACKAGE_ROOT)
        forkserver.ensure_running()
    finally:
        if elsewhere:
            os.chdir(cwd)
            os.environ.pop(PRELOAD_CWD_VAR, None)
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    _warm = True
    return True


def forkserver_pid() -> int | None:
    """The pid of the forkserver this process started (None: none yet). multiprocessing keeps it in
    a private attribute of its module's server only; the forkserver is this process's child."""
    from multiprocessing import forkserver

    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)


def forkserver_exit_code(pid: int) -> int | None:
    """How the forkserver ``pid`` (this process's child) ended, written as multiprocessing writes a
    child's exit code (``-N``: killed by signal N), or None while it runs (or where it cannot be
    told: no ``waitid``, not a child of this process).

    Read with ``WNOWAIT``, which leaves it unreaped: multiprocessing reaps it when it starts the next
    one. A forkserver's death shows first as exit code 255 on every process it forked (their exit
    codes come through it); this is how it is told from a sampler's own 255.
    """
    if not hasattr(os, "waitid"):
        return None
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def restart_forkserver() -> int | None:
    """Start the forkserver again, after it died, as :func:`warm_forkserver` started it: the stop
    signals kept from it (and so from every child it forks), the same preload. Returns its pid.

    Called from whichever thread saw the death (usually the DataModule's prefetch thread), where
    Python cannot change a signal's disposition: :func:`fastlight.procs.children_ignore_stop_signals`
    then blocks them in this thread for the start, and a blocked signal stays blocked through fork
    and exec. A forkserver that kept SIGTERM's default action would die of a group SIGTERM
    (``scancel``) and take its samplers with it while the trainer stops. The preload is skipped
    where the working directory holds another fastlight (``warm_forkserver`` changes directory for
    that, which a thread of a running trainer must not do): the samplers then import from their
    own, pinned ``sys.path`` (:func:`pin_fastlight_path`).
    """
    import multiprocessing
    from multiprocessing import forkserver

    from fastlight.procs import children_ignore_stop_signals

    context = multiprocessing.get_context("forkserver")
    preload = list(getattr(forkserver._forkserver, "_preload_modules", PRELOAD))
    if shadowing_entry([""]) is not None:
        context.set_forkserver_preload([])
    try:
        with children_ignore_stop_signals():
            forkserver.ensure_running()  # reaps the dead one, starts the new one
    finally:
        context.set_forkserver_preload(preload)
    return forkserver_pid()


def shadowing_entry(path: Sequence[str]) -> int | None:
    """The index in ``path`` of the first entry holding a ``fastlight`` other than the one running
    here (e.g. the working directory of a run started next to a checkout), if that is the one an
    import through ``path`` would find; None when it finds this one, or none (an editable install's
    finder then supplies this one)."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("fastlight", list(path))
    if spec is None or _same_package(spec):
        return None
    return next(i for i, entry in enumerate(path) if PathFinder.find_spec("fastlight", [entry]) is not None)


def pin_fastlight_path() -> str | None:
    """Make ``sys.path`` find the running fastlight before any other, for the child processes about
    to start: they import it afresh through ``sys.path`` (spawn hands them the trainer's), and
    :func:`fastlight.cli.cli_main` puts the working directory first, so a run started next to another
    ``fastlight/`` folder would mix two versions. The directory holding this fastlight goes in front
    of the entry that shadows it; nothing changes otherwise. Returns the shadowing entry, or None."""
    index = shadowing_entry(sys.path)
    if index is None:
        return None
    shadow = sys.path[index]
    sys.path.insert(index, PACKAGE_ROOT)
    return shadow


def _same_package(spec: object) -> bool:
    locations = getattr(spec, "submodule_search_locations", None) or []
    return any(os.path.realpath(p) == os.path.realpath(PACKAGE_DIR) for p in locations)


def resolve_start_method(value: str | None) -> str:
    """``None`` -> ``forkserver`` if :func:`warm_forkserver` ran in this process, else ``spawn``.
    A bad value raises one line naming ``--data.start_method``."""
    if value is None:
        return "forkserver" if _warm else "spawn"
    check_start_method(value)
    return value


def check_start_method(value: str | None) -> None:
    if value is None:
        return
    if value not in START_METHODS:
        raise ValueError(f"--data.start_method must be null, {' or '.join(START_METHODS)}, got {value!r}")
    if value == "forkserver" and not forkserver_available():
        raise ValueError(f"--data.start_method forkserver is not available on {sys.platform}: use spawn")


def peek_data(argv: Sequence[str], key: str) -> str | None:
    """``data.<key>`` as the command line gives it, if it is a string (:func:`peek_value`); ``None``
    otherwise. Used before Lightning is imported, to warm the forkserver for the run's env
    (:func:`peek_env_id`) or not at all (``--data.start_method spawn``); the CLI parses and checks
    the real value later."""
    value = peek_value(argv, "data", key)[1]
    return value if isinstance(value, str) else None


def peek_value(argv: Sequence[str], section: str | None, key: str) -> tuple[bool, Any]:
    """``(found, value)`` of the setting ``<section>.<key>`` (``section`` None: a top-level one, such
    as ``seed_everything``) as the command line gives it, without parsing it the CLI's way: the
    last ``--<section>.<key>`` or ``--<section>.init_args.<key>`` flag (its value read as YAML, as
    the CLI reads it), else the last ``--config`` file that sets it (plain or ``init_args`` form).
    ``key`` ``class_path`` also reads ``--<section> <class>`` and a config's ``<section>: <class>``.

    A best guess, for what runs before Lightning is imported: the CLI parses the real values later,
    and whatever is planned from a peeked one is checked against them."""
    names = [f"--{key}"] if section is None else [f"--{section}.{key}", f"--{section}.init_args.{key}"]
    if section is not None and key == "class_path":
        names.append(f"--{section}")
    found, value = False, None
    configs = []
    for i, arg in enumerate(argv):
        following = argv[i + 1] if i + 1 < len(argv) else None
        for name in names:
            if arg.startswith(f"{name}="):
                found, value = True, _yaml_value(arg.split("=", 1)[1])
            elif arg == name and following is not None:
                found, value = True, _yaml_value(following)
        if arg.startswith("--config="):
            configs.append(arg.split("=", 1)[1])
        elif arg in ("--config", "-c") and following is not None:
            configs.append(following)
    if found:
        return True, value
    for path in reversed(configs):
        hit = _in_config(path, section, key)
        if hit[0]:
            return hit
    return False, None


def _yaml_value(text: str) -> Any:
    try:
        import yaml

        return yaml.safe_load(text)
    except Exception:  # noqa: BLE001  (not YAML: the CLI reads it as the string it is)
        return text


def peek_env_id(argv: Sequence[str]) -> str | None:
    """The run's ``data.env_id`` (:func:`peek_data`); ``None`` leaves the forkserver without an
    env package to preload (a warm start still, not a wrong one)."""
    return peek_data(argv, "env_id")


@functools.lru_cache(maxsize=32)
def _load_config(path: str) -> Any:
    """A config file, parsed once per process (a head start peeks at some 30 settings; only read)."""
    try:
        import yaml

        with open(path) as f:
            return yaml.safe_load(f)
    except Exception:  # noqa: BLE001  (the CLI reports an unreadable config with its own message later)
        return None


def _in_config(path: str, section: str | None, key: str) -> tuple[bool, Any]:
    config = _load_config(path)
    if not isinstance(config, dict):
        return False, None
    if section is None:
        return (key in config), config.get(key)
    node = config.get(section)
    if isinstance(node, str) and key == "class_path":
        return True, node
    if not isinstance(node, dict):
        return False, None
    if key == "class_path":
        return ("class_path" in node), node.get("class_path")
    args = node.get("init_args") if isinstance(node.get("init_args"), dict) else node
    return (key in args), args.get(key)
