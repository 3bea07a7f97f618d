"""Two DDP ranks (gloo on CPU, Lightning's own launcher) training an RLModule on fixed rollouts with
PreemptionCheckpoint and LostRankCheckpoint (as the CLI attaches them); rank ``--signal-rank`` sends
SIGTERM to itself in the middle of update ``--at``, and with ``--second`` both ranks get another stop
signal while the stop checkpoint is written.

    python -m tests.faults.ddp_stop_probe --root DIR --signal-rank 1 --at 2 --second
    python -m tests.faults.ddp_stop_probe --root DIR --updates 300     # no signal: measure
    python -m tests.faults.ddp_stop_probe --root DIR --lose-rank 1 --lose-signal SIGKILL --at 2 \
        --peer-timeout-s 10 [--rollback]                               # a lost rank (peer_watch)

Under ``--strategy fsdp2`` (``--sharded-every-updates K``: LostRankCheckpoint's sharded checkpoint
every K updates, its clock counting updates) every rank records the sum of the whole weights after
each update in ``DIR/sums<r>.json`` (``--resume CKPT``: also at the start, as ``start``, with the
global step and policy version the fit starts from).

With ``--lose-rank``, that rank sends ``--lose-signal`` (SIGKILL, SIGSTOP) to itself at the start of
update ``--at`` (``--mid``: after that update's first optimizer step, before its second backward;
rank 0 then saves its weights and optimizer state at the end of update ``--at - 1`` to
``DIR/boundary.pt``, what the survivor's checkpoint must hold with ``--rollback``, LostRankCheckpoint's
``rollback=True``).

Lightning's launcher starts rank 1 as this same command. Each rank writes ``DIR/rank<r>.json``: its
exit path, the policy version, the stop signals it ignored, the per-update agreement's count and
wall time, and the median time from one update's end to the next's; after an unsignalled run, also
the time of one ``strategy.reduce`` (what the agreement calls: a barrier and an all-reduce) and of
a bare ``all_reduce``, over ``--repeat`` calls.
(``tests/faults/test_ddp_stop.py`` runs it; ``benchmarks/results/faults.md`` has the numbers.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from fastlight.callbacks import preemption, timed_checkpoint
from fastlight.callbacks.lost_rank import LostRankCheckpoint
from fastlight.callbacks.preemption import PreemptionCheckpoint
from fastlight.callbacks.timed_checkpoint import max_over_ranks
from fastlight.checkpoints import AtomicCheckpointIO
from fastlight.modules.rl_module import RLModule
from fastlight.rollout import Rollout
from fastlight.sampling.collector import Collector
from tests.fake_envs import FixedLengthEnv


def rollout() -> Rollout:
    torch.manual_seed(0)
    envs = [FixedLengthEnv(lengths=(3, 5), tag=i) for i in range(2)]
    module = RLModule(obs_dim=3, action_dim=2)
    module.configure_model()
    return Collector(envs, mode="dpsa", max_horizon=6).collect(module.policy)


class Rollouts(IterableDataset):
    def __init__(self, n: int) -> None:
        self.item, self.n = rollout(), n

    def __iter__(self):
        return iter([self.item] * self.n)


class SignalledRank(RLModule):
    """Rank ``rank`` sends SIGTERM to itself in update ``at`` (0-based); with ``second``, the stop
    checkpoint's state sends every rank one more stop signal (rank 0 SIGINT, others SIGTERM) while
    Lightning gathers it, i.e. during the stop save."""

    def __init__(
        self, rank: int = -1, at: int = -1, second: bool = False, lose: int = -1, lose_signal: int = 0,
        mid: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=2)
        self.signal_rank, self.at, self.second = rank, at, second
        self.lose, self.lose_signal, self.mid = lose, lose_signal, mid
        self.backwards = 0  # in the current update
        self.lost_at_file: Path | None = None  # where the lost rank writes when it sent its signal
        self.batch_ends: list[float] = []  # when each update ended (perf_counter)
        self.boundary_file: Path | None = None
        self.sums_file: Path | None = None

    def lose_now(self) -> None:
        if self.lost_at_file is not None:
            self.lost_at_file.parent.mkdir(parents=True, exist_ok=True)
            self.lost_at_file.write_text(repr(time.time()))
        os.kill(os.getpid(), self.lose_signal)

    def training_step(self, batch, batch_idx):
        if self.trainer.global_rank == self.signal_rank and batch_idx == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        self.backwards = 0
        if self.trainer.global_rank == self.lose and batch_idx == self.at and not self.mid:
            self.lose_now()
        return super().training_step(batch, batch_idx)

    def manual_backward(self, loss, *args, **kwargs):
        self.backwards += 1
        lost_here = self.trainer.global_rank == self.lose and self.mid and self.backwards == 2
        if lost_here and self.global_step == 2 * self.at + 1:
            self.lose_now()
        return super().manual_backward(loss, *args, **kwargs)

    def on_train_start(self):
        super().on_train_start()
        # Adam's step counts (the optimizer state restored too) and the whole weights' sum.
        adam = {int(s["step"]) for s in self.optimizers().optimizer.state.values()}
        self.start = {"step": self.global_step, "version": self.policy_version, "adam_steps": sorted(adam),
                      "sum": self.weight_sum()}  # fmt: skip
        self.sums: dict[int, float] = {}

    def weight_sum(self) -> float:
        """The sum of the whole weights (under fsdp2 gathered from the shards: every rank takes part)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from torch.distributed.tensor import DTensor

        sharded = any(isinstance(p, DTensor) for p in self.parameters())
        state = (
            get_model_state_dict(self, options=StateDictOptions(full_state_dict=True)) if sharded else None
        )
        state = state if state is not None else self.state_dict()
        return sum(float(v.double().sum()) for k, v in state.items() if k.startswith("policy."))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.batch_ends.append(time.perf_counter())
        if self.sums_file is not None:
            self.sums[self.policy_version] = self.weight_sum()
            out = self.sums_file / f"sums{self.trainer.global_rank}.json"
            out.write_text(json.dumps({"start": self.start, "sums": self.sums}))
        if self.boundary_file is not None and batch_idx == self.at - 1 and self.trainer.global_rank == 0:
            optimizer = self.optimizers().optimizer
            torch.save(
                {"state_dict": self.state_dict(), "optimizer": optimizer.state_dict()}, self.boundary_file
            )

    def on_save_checkpoint(self, checkpoint):
        super().on_save_checkpoint(checkpoint)
        if self.second:
            os.kill(os.getpid(), signal.SIGINT if self.trainer.global_rank == 0 else signal.SIGTERM)
            for _ in range(1000):
                pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--signal-rank", type=int, default=-1)
    p.add_argument("--at", type=int, default=-1)
    p.add_argument("--second", action="store_true")
    p.add_argument("--updates", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=1000)
    p.add_argument("--lose-rank", type=int, default=-1)
    p.add_argument("--lose-signal", default="SIGKILL")
    p.add_argument("--mid", action="store_true")
    p.add_argument("--peer-timeout-s", type=float, default=None)
    p.add_argument("--rollback", action="store_true")
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--sharded-every-updates", type=int, default=None)
    p.add_argument("--resume", default=None)
    args = p.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as in a terminal
    root = Path(args.root)
    timeout = None if args.peer_timeout_s is None else args.peer_timeout_s / 60
    cb = PreemptionCheckpoint(every_minutes=None)
    agreement = preemption.max_over_ranks = CountedAgreement()
    peer = {} if timeout is None else {"peer_timeout_minutes": timeout}
    every = args.sharded_every_updates
    if every is not None:  # the sharded checkpoints' clock counts updates: one is due every `every`
        timed_checkpoint._now = lambda: float(module.policy_version)
    lost = LostRankCheckpoint(**peer, rollback=args.rollback, sharded_every_minutes=every and every / 60)
    module = SignalledRank(
        args.signal_rank,
        args.at,
        args.second,
        args.lose_rank,
        int(signal.Signals[args.lose_signal]),
        args.mid,
    )
    module.lost_at_file = root / "lost_at.txt"
    if args.mid:
        root.mkdir(parents=True, exist_ok=True)
        module.boundary_file = root / "boundary.pt"
    if args.strategy == "fsdp2":
        root.mkdir(parents=True, exist_ok=True)
        module.sums_file = root
    trainer = L.Trainer(
        strategy=args.strategy, devices=args.devices, accelerator="cpu", max_steps=2 * args.updates,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[cb, lost], plugins=[AtomicCheckpointIO()], default_root_dir=str(root),
    )  # fmt: skip
    report: dict = {"exit": "finished"}
    t0 = time.perf_counter()
    try:
        trainer.fit(module, DataLoader(Rollouts(args.updates + 10), batch_size=None), ckpt_path=args.resume)
    except SystemExit as e:
        report["exit"] = e.code
        raise
    except RuntimeError as e:  # a collective failed: a rank was lost
        report["exit"] = f"RuntimeError: {str(e).splitlines()[0][:200]}"
        report["peer_lost_line"] = lost.peer_lost_line
        raise
    finally:
        report.update(
            rank=trainer.global_rank, version=module.policy_version, ignored=cb.ignored_signals,
            agreements=agreement.calls, agreement_seconds=agreement.seconds,
            fit_seconds=time.perf_counter() - t0, update_seconds=median_interval(module.batch_ends),
        )  # fmt: skip
        if report["exit"] == "finished":
            report.update(reduce_seconds=time_collectives(trainer, args.repeat))
        root.mkdir(parents=True, exist_ok=True)
        (root / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


class CountedAgreement:
    """PreemptionCheckpoint's per-update agreement (its two values: the stop signal and the timer),
    counted and timed; any other use of the collective (a failed save's) passes through uncounted."""

    def __init__(self) -> None:
        self.calls, self.seconds = 0, 0.0

    def __call__(self, trainer: L.Trainer, *values: int) -> list[int]:
        t0 = time.perf_counter()
        out = max_over_ranks(trainer, *values)
        if len(values) == 2:
            self.calls += 1
            self.seconds += time.perf_counter() - t0
        return out


def median_interval(times: list[float]) -> float | None:
    gaps = sorted(b - a for a, b in zip(times, times[1:], strict=False))
    return gaps[len(gaps) // 2] if gaps else None


def time_collectives(trainer: L.Trainer, repeat: int) -> dict[str, float]:
    """Seconds per call of the agreement's collective and of a bare all-reduce (after the fit, the
    process group still up)."""
    import torch.distributed as dist

    x = torch.tensor([0, 0])
    out = {}
    for name, fn in (
        ("strategy_reduce_max", lambda: trainer.strategy.reduce(x, reduce_op="max")),
        ("all_reduce_max", lambda: dist.all_reduce(x, op=dist.ReduceOp.MAX)),
    ):
        for _ in range(20):
            fn()
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        out[name] = (time.perf_counter() - t0) / repeat
    return out


if __name__ == "__main__":
    main()
