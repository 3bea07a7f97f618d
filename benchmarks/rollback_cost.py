"""The per-update cost of LostRankCheckpoint's rollback point (fastlight.ranks.rollback, rollback=True):
one host copy of the trainable weights and the optimizer state, reusing its buffers.

    python -m benchmarks.rollback_cost                 # the MT10 VLA's size: 49.6 MiB + Adam's moments
    python -m benchmarks.rollback_cost --weights-mib 500 --tensors 300

Prints the median and the fastest of ``--repeat`` copies (after two warm-up copies).
"""

from __future__ import annotations

import argparse
import time

import torch

from fastlight.ranks.rollback import _host_copy, _nbytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights-mib", type=float, default=49.6, help="trainable weights, MiB (float32)")
    p.add_argument("--tensors", type=int, default=100, help="how many tensors they are split into")
    p.add_argument("--repeat", type=int, default=10)
    args = p.parse_args()
    n = max(1, int(args.weights_mib * 2**20 / 4 / args.tensors))
    weights = {f"p{i}": torch.randn(n) for i in range(args.tensors)}
    moments = {i: {"step": torch.tensor(1.0), "exp_avg": torch.randn(n), "exp_avg_sq": torch.randn(n)}
               for i in range(args.tensors)}  # fmt: skip
    optimizer = [{"state": moments, "param_groups": [{"lr": 1e-4, "params": list(range(args.tensors))}]}]
    held_w = held_o = None
    seconds = []
    for _ in range(args.repeat + 2):
        t0 = time.perf_counter()
        held_w = _host_copy(weights, held_w)
        held_o = _host_copy(optimizer, held_o)
        seconds.append(time.perf_counter() - t0)
    seconds = sorted(seconds[2:])
    mib = (_nbytes(weights) + _nbytes(optimizer)) / 2**20
    print(f"rollback point of {mib:.0f} MiB: median {seconds[len(seconds) // 2] * 1e3:.1f} ms, "
          f"fastest {seconds[0] * 1e3:.1f} ms per update")  # fmt: skip


if __name__ == "__main__":
    main()
