"""The cost of one sharded checkpoint under ``--trainer.strategy fsdp2`` (LostRankCheckpoint's
``sharded_every_minutes``): ``fastlight fit`` as typed, each sharded save timed on every rank.

    python -m benchmarks.sharded_save fit --config examples/merge.yaml --trainer.strategy fsdp2 \
        --trainer.devices 2 --trainer.accelerator cpu --trainer.callbacks+ fastlight.LostRankCheckpoint \
        --trainer.callbacks.sharded_every_minutes 0.001 ...      # a save after every update

Each rank prints one ``sharded save`` line per save: the seconds from entering the save until every
rank's shards and Lightning's ``meta.pt`` are on disk (the collective's barrier), and the folder's size.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def timed_saves() -> None:
    from fastlight import lightning_compat

    save = lightning_compat.save_sharded

    def timed(trainer, path: str) -> None:  # noqa: ANN001 - a Lightning Trainer
        t0 = time.perf_counter()
        save(trainer, path)
        seconds = time.perf_counter() - t0
        mib = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 2**20
        where = f"rank {trainer.global_rank}, global step {trainer.global_step}"
        print(f"sharded save: {where}: {seconds:.3f} s, {mib:.2f} MiB", file=sys.stderr, flush=True)

    lightning_compat.save_sharded = timed


if __name__ == "__main__":  # spawned samplers import this module again: only the command runs this
    from fastlight.__main__ import main

    timed_saves()
    main()
