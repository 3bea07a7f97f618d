"""How fastlight starts its child processes: ``spawn``, or a ``forkserver`` warmed at start-up.

The ``fastlight`` command starts a forkserver as its very first step (:func:`warm_forkserver`): a
clean single-threaded process that imports the sampler's modules (and the run's env package) on the
other core *while* the trainer imports Lightning; samplers are forked from it with those modules
loaded, sharing no trainer state. Library use keeps ``spawn`` unless it warms a forkserver or passes
``start_method="forkserver"``. This module imports nothing heavy: it runs before Lightning.
"""

from __future__ import annotations

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
#: The fastlight package running here.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_warm = False


def forkserver_available() -> bool:
    import multiprocessing

    return "forkserver" in multiprocessing.get_all_start_methods()


def warm_forkserver(env_id: str | None = None) -> bool:
    """Start the forkserver now, importing the sampler's modules (and ``env_id``'s package) in it; False
    (changing nothing) where the platform has none. Later calls are no-ops."""
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
    # The forkserver's sys.path[0] is its working directory: a fastlight/ there other than this one
    # would be what it preloads, so it then preloads nothing.
    preload = [] if cwd_holds_another_fastlight() else PRELOAD
    multiprocessing.get_context("forkserver").set_forkserver_preload(preload)
    # Started with the stop signals ignored (fastlight.procs.STOP_SIGNALS, not imported: it loads
    # torch), the forkserver and its children ignore them from their first instruction: the trainer
    # handles them and stops its children itself.
    main_thread = threading.current_thread() is threading.main_thread()
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in stop_signals} if main_thread else {}
    try:
        forkserver.ensure_running()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    _warm = True
    return True


def forkserver_pid() -> int | None:
    """The pid of the forkserver this process started (None: none yet; a private attribute)."""
    from multiprocessing import forkserver

    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)


def cwd_holds_another_fastlight() -> bool:
    """Whether the working directory holds a ``fastlight/`` package other than the one running here."""
    here = os.path.join(os.getcwd(), "fastlight")
    return os.path.isfile(os.path.join(here, "__init__.py")) and not os.path.samefile(here, PACKAGE_DIR)


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
    """``data.<key>`` as the command line gives it, if it is a string: the last ``--data.<key>`` or
    ``--data.init_args.<key>`` flag, else the last ``--config`` file that sets it; ``None`` otherwise.
    A best guess, read before Lightning is imported; the CLI parses and checks the real value later."""
    names = (f"--data.{key}", f"--data.init_args.{key}")
    flag: str | None = None
    for i, arg in enumerate(argv):
        following = argv[i + 1] if i + 1 < len(argv) else None
        for name in names:
            if arg.startswith(f"{name}="):
                flag = arg.split("=", 1)[1]
            elif arg == name and following is not None:
                flag = following
    if flag is not None:
        return flag
    for path in reversed(config_files(argv)):
        found, value = _in_config(path, key)
        if found:
            return value if isinstance(value, str) else None
    return None


def config_files(argv: Sequence[str]) -> list[str]:
    """The ``--config`` / ``-c`` values of a command line, in order."""
    values = []
    for i, arg in enumerate(argv):
        if arg in ("-c", "--config") and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif arg.startswith("--config="):
            values.append(arg.removeprefix("--config="))
    return values


def peek_env_id(argv: Sequence[str]) -> str | None:
    """The run's ``data.env_id`` (:func:`peek_data`); ``None``: no env package to preload."""
    return peek_data(argv, "env_id")


def _in_config(path: str, key: str) -> tuple[bool, Any]:
    """Whether the config file ``path`` sets ``data.<key>`` (plain or ``init_args`` form), and to what."""
    try:
        import yaml

        with open(path) as f:
            config = yaml.safe_load(f)
    except Exception:  # noqa: BLE001  (the CLI reports an unreadable config with its own message later)
        return False, None
    node = config.get("data") if isinstance(config, dict) else None
    if not isinstance(node, dict):
        return False, None
    args = node.get("init_args") if isinstance(node.get("init_args"), dict) else node
    return (key in args), args.get(key)
