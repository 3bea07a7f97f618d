"""``fastlight`` console script and ``python -m fastlight``: a deliberately light entry module.

Spawned children re-import the parent's main module, the console script's file, which imports the
module named in ``[project.scripts]``: were that ``fastlight.cli``, every sampler would load Lightning.
So this module imports nothing at the top and loads the CLI only when ``main`` runs. For ``fit``,
``main`` first warms a forkserver (:mod:`fastlight.fleet.start`).
"""

from __future__ import annotations

import os
import signal
import sys

INTERRUPTED = "fastlight: interrupted (Ctrl-C) while starting; nothing was trained"


def _interrupted_while_importing(signum: int, frame: object) -> None:
    # A KeyboardInterrupt raised inside an import leaves that module half-initialised (numpy's lazy
    # attributes then recurse without end, and the next import fails with that instead): leave at once.
    print(INTERRUPTED, file=sys.stderr, flush=True)
    os._exit(130)


def main() -> None:
    # Ctrl-C before the run handles its stop signals is one line and 128 + SIGINT, as during training,
    # not the traceback of whichever import it interrupted.
    signal.signal(signal.SIGINT, _interrupted_while_importing)
    try:
        _main()
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr, flush=True)
        raise SystemExit(130) from None


def _main() -> None:
    # First: MuJoCo's offscreen GL backend, needed by the forkserver, evaluate and plot before cli_main.
    os.environ.setdefault("MUJOCO_GL", "egl")
    if len(sys.argv) > 1 and sys.argv[1] == "fit" and "--help" not in sys.argv and "-h" not in sys.argv:
        from fastlight.fleet.start import peek_data, peek_env_id, warm_forkserver

        if peek_data(sys.argv[2:], "start_method") != "spawn":
            warm_forkserver(peek_env_id(sys.argv[2:]))
    from fastlight.cli import main as cli

    signal.signal(signal.SIGINT, signal.default_int_handler)  # imported: a KeyboardInterrupt is safe again
    cli()


if __name__ == "__main__":
    main()
