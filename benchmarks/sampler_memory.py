"""A sampler's memory over many rounds, in one process: what grows, Python objects or native heap.

    nice -n 5 python -m benchmarks.sampler_memory --rounds 60                 # as samplers run now
    nice -n 5 python -m benchmarks.sampler_memory --rounds 60 --gc python     # Python's own gc schedule
    python -m benchmarks.sampler_memory --rounds 15 --trace 1 --top 15        # tracemalloc's top growers

Runs the loop of a sampler process (``fastlight.sampling.worker``) without the trainer: a
:class:`~fastlight.sampling.collector.Collector` over ``--envs`` envs of ``--env-id`` (built as
:class:`~fastlight.sampling.bundle.SamplerConfig` builds them) and an ``MLPActorCritic`` in one
thread. Each round does the next cycle's reset ahead, loads "new" weights in place, takes the
delivery checksum, reseeds (``begin_round``), collects ``--cycles-per-step`` cycles and turns them
into the item a sampler sends (numpy, its ``SamplerState``, pickled as the pipe would); ``--gc``
says how garbage is collected (``sampler``: as ``run_sampler`` does).

After ``--warmup`` rounds it takes its first reading, then one every ``--every`` rounds: ``RssAnon``
(``/proc/self/status``), glibc's heap over all arenas (``mallinfo2``: in use and free), CPython's
small-object arenas (mapped, and in use) and the full collections so far; at the end the growth of
each in MB per 100 cycles and the anonymous mappings (``/proc/self/smaps``) that grew most. With
``--trace N`` tracemalloc runs from the first reading with ``N`` frames (ten times slower) and the
top growers between the two snapshots are printed. ``--trim`` calls ``malloc_trim(0)`` before each
reading, which gives back what glibc merely keeps free.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import pickle
import sys
import tempfile
import time
import tracemalloc

import torch


def rss_anon_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost",
    )]  # fmt: skip


def malloc_mb() -> tuple[float, float]:
    """glibc's heap over all its arenas (``mallinfo2``): (MB in use, MB free but kept), NaN elsewhere."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc before 2.33
        return float("nan"), float("nan")
    fn.restype = _MallInfo2
    m = fn()
    return (m.uordblks + m.hblkhd) / 2**20, m.fordblks / 2**20


def pymalloc_mb() -> tuple[float, float]:
    """CPython's small-object allocator (``sys._debugmallocstats``, which writes to fd 2): (MB of arenas
    mapped, MB of blocks in use in them)."""
    with tempfile.TemporaryFile(mode="w+") as f:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        mapped = used = float("nan")
        for line in f:
            if "bytes/arena" in line:
                mapped = int(line.rsplit("=", 1)[1].replace(",", "")) / 2**20
            elif line.startswith("# bytes in allocated blocks"):
                used = int(line.rsplit("=", 1)[1].replace(",", "")) / 2**20
    return mapped, used


def anon_mappings() -> dict[tuple[int, str], tuple[int, int]]:
    """(KiB of anonymous memory, size in KiB) of each mapping of this process (``/proc/self/smaps``), by
    (start, name)."""
    out: dict[tuple[int, str], tuple[int, int]] = {}
    key = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                start, end = (int(x, 16) for x in head[0].split("-"))
                key, size = (start, head[5] if len(head) > 5 else ""), (end - start) >> 10
            elif head[0] == "Anonymous:" and key is not None:
                out[key] = (int(head[1]), size)
    return out


def _grown_mappings(before: dict, after: dict, top: int) -> list[str]:
    """The mappings whose anonymous memory grew most (a mapping that moved or was split counts as new)."""
    rows = []
    for key, (kib, size) in after.items():
        grew = kib - before.get(key, (0, 0))[0]
        if grew > 0:
            start, name = key
            rows.append((grew, f"{grew:+7d} KiB  at {hex(start)} (now {kib} of {size} KiB) {name}"))
    gone = sum(kib for key, (kib, _) in before.items() if key not in after)
    lines = [text for _, text in sorted(rows, reverse=True)[:top]]
    return [*lines, f"{-gone:+7d} KiB  in mappings that are gone or changed"]


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env-id", default="highway-fast-v0")
    ap.add_argument("--envs", type=int, default=4, help="envs of the sampler (highway_dpsa.yaml: 8 over 2)")
    ap.add_argument("--rounds", type=int, default=100, help="measured rounds, after the warm-up")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--cycles-per-step", type=int, default=2)
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("--trace", type=int, default=0, help="tracemalloc frames (0: off)")
    ap.add_argument("--top", type=int, default=12, help="growers to print with --trace")
    ap.add_argument("--trim", action="store_true", help="malloc_trim(0) before each reading")
    ap.add_argument(
        "--gc", choices=("sampler", "python", "freeze"), default="sampler",
        help="sampler: as a sampler process does (gc.freeze() once built, gc.collect() after every round); "
        "python: Python's own schedule (samplers before issue 40 item 7); freeze: gc.freeze() alone",
    )  # fmt: skip
    ap.add_argument("--every", type=int, default=20, help="print a reading every this many rounds")
    args = ap.parse_args()

    from fastlight.data.env_spec import EnvSpec
    from fastlight.models.mlp import MLPActorCritic
    from fastlight.rollout import Rollout
    from fastlight.sampling.bundle import SamplerConfig
    from fastlight.sampling.collector import Collector
    from fastlight.sampling.worker import rollout_to_numpy
    from fastlight.weights.checksum import delivery_checksum

    torch.set_num_threads(1)
    cfg = SamplerConfig(env_id=args.env_id, num_envs=args.envs, seed=0)
    envs = cfg.build_envs()
    spec = EnvSpec.from_env(envs[0])
    policy = MLPActorCritic(spec.obs_dim, spec.action_dim, continuous=spec.continuous).eval()
    published = {k: v.clone() for k, v in policy.state_dict().items()}
    collector = Collector(envs, mode="dpsa", termination_threshold=args.threshold, seed=cfg.seed)
    if args.gc != "python":  # as run_sampler does once the Collector is built
        gc.collect()
        gc.freeze()

    cycles = 0

    def one_round(version: int) -> None:
        nonlocal cycles
        collector.reset_ahead()  # what a strictly on-policy sampler does while it waits
        with torch.no_grad():
            for k, v in policy.state_dict().items():  # in place, as SharedWeights.load_into does
                v.copy_(published[k])
        held = delivery_checksum(policy).value
        collector.begin_round()
        parts = [
            collector.collect(policy, policy_version=version, cycle=k) for k in range(args.cycles_per_step)
        ]
        cycles += len(parts)
        item = rollout_to_numpy(Rollout.cat(parts, dim=0))
        item.stats.sampler = 0
        item.stats.sampler_states = {0: collector.state(version)}
        item.stats.weights_held = [("sampler 0", version, held)]
        pickle.dumps(("rollout", version, item), protocol=pickle.HIGHEST_PROTOCOL)
        if args.gc == "sampler":
            gc.collect()

    def reading() -> tuple[float, float, float, float, float]:
        if args.trim:
            _trim()
        return (rss_anon_mb(), *malloc_mb(), *pymalloc_mb())

    t0 = time.perf_counter()
    for v in range(args.warmup):
        one_round(v)
    gc.collect()
    full0 = gc.get_stats()[2]["collections"]
    if args.trace:
        tracemalloc.start(args.trace)
    first = tracemalloc.take_snapshot() if args.trace else None
    c0, (rss0, used0, free0, py0, pyused0), maps0 = cycles, reading(), anon_mappings()
    traced0 = tracemalloc.get_traced_memory()[0] if args.trace else 0
    print(
        f"warm-up: {args.warmup} rounds, {cycles} cycles, {time.perf_counter() - t0:.0f} s, "
        f"RssAnon {rss0:.2f} MB, malloc in use {used0:.2f} MB, free {free0:.2f} MB, "
        f"pymalloc arenas {py0:.0f} MB ({pyused0:.2f} MB in use)"
    )
    for r in range(args.rounds):
        one_round(args.warmup + r)
        if (r + 1) % args.every == 0 or r + 1 == args.rounds:
            traced = (tracemalloc.get_traced_memory()[0] - traced0) / 2**20 if args.trace else float("nan")
            rss, used, free, py, pyused = reading()
            print(
                f"round {args.warmup + r + 1:5d}  cycles {cycles - c0:6d}  RssAnon {rss:8.2f} MB  "
                f"malloc in use {used:7.2f} free {free:6.2f}  pymalloc {py:4.0f} MB ({pyused:6.2f} in use)  "
                f"traced +{traced:.3f} MB  "
                f"full gc {gc.get_stats()[2]['collections'] - full0}  {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    gc.collect()
    n = max(cycles - c0, 1)
    rss, used, free, py, pyused = reading()
    grown = (("RssAnon", rss - rss0), ("malloc in use", used - used0), ("malloc free", free - free0),
             ("pymalloc arenas", py - py0), ("pymalloc in use", pyused - pyused0))  # fmt: skip
    for what, grew in grown:
        print(f"{what} {grew:+.2f} MB over {n} cycles: {100 * grew / n:+.3f} MB per 100 cycles")
    print("anonymous mappings that grew most:")
    for line in _grown_mappings(maps0, anon_mappings(), args.top):
        print("  " + line)
    if first is not None:
        last = tracemalloc.take_snapshot()
        traced = (tracemalloc.get_traced_memory()[0] - traced0) / 2**20
        print(f"traced Python memory +{traced:.3f} MB: {100 * traced / n:.3f} MB per 100 cycles")
        for stat in last.compare_to(first, "traceback")[: args.top]:
            if stat.size_diff <= 0:
                continue
            print(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks")
            for line in stat.traceback.format()[-2 * args.trace :]:
                print("    " + line)
    collector.close()


if __name__ == "__main__":
    main()
