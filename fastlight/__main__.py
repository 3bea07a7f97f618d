"""``fastlight`` console script and ``python -m fastlight``: a deliberately light entry module.

Spawned children (samplers, the inference worker) re-import the parent's main module before
they run (``multiprocessing`` spawn): the console script's file, which imports the module named
in ``[project.scripts]``. Were that ``fastlight.cli``, every sampler would load Lightning, the
CLI and transformers it never uses (about 0.2 GB and seconds of start-up each, issue 14). So
this module imports nothing at the top and loads the CLI only when ``main`` runs, which the
console script's ``__name__ == "__main__"`` guard keeps from happening in a child.
(``python -m fastlight`` is not re-imported at all: spawn skips ``*.__main__`` modules.)

For ``fit``, the first thing ``main`` does is start a forkserver that imports the samplers'
modules and the run's env package on the other core while this process imports Lightning
(:mod:`fastlight.fleet.start`); the samplers are then forked from it, warm.
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
    # Ctrl-C before the run handles its stop signals (fastlight.callbacks.preemption: while Python imports
    # Lightning, parses, builds the module and the probe env) is one line and 128 + SIGINT, as during
    # training, not the traceback of whichever import it interrupted. Nothing is left running: the
    # forkserver (started with Ctrl-C ignored) exits when this process does.
    signal.signal(signal.SIGINT, _interrupted_while_importing)
    try:
        _main()
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr, flush=True)
        raise SystemExit(130) from None


def _main() -> None:
    # First of all: MuJoCo (Meta-World's image mode) renders offscreen only with a GL backend set,
    # and the forkserver below, ``evaluate`` and ``plot`` all start before ``cli_main`` would set it.
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
