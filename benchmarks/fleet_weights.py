"""Weight delivery to remote Ray samplers: time per policy version, vs a checkpoint save + load.

    python -m benchmarks.fleet_weights --params 1e6 1e8 --reps 5 --samplers 2

A two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: the head, where this process
is the trainer, and a node 2 whose custom resource ``sim`` alone places the samplers), as in
``tests/fleet/ray/test_ray_fleet.py``. Each sampler actor holds a policy copy of the given size
(``benchmarks.sync``'s square float32 ``nn.Linear`` stack) and fastlight's own actor-side weight source
(:class:`fastlight.fleet.ray.sampler_actor.ActorWeights`). Per version, timed from the trainer's side:

- **Ray object store** (what :meth:`RaySamplerFleet.publish` does): :meth:`StoreWeights.put` (the
  weights packed into flat per-dtype buckets, one ``ray.put``), every actor sent the ref; then each
  actor loads it into its copy, as a sampler does when its next round starts
  (``ActorWeights.load_into``: ``ray.get``, the object moved to node 2 once, then unpacked into the
  parameters). The figure runs to the last actor's copy done.
- **Checkpoint**: ``torch.save`` of the state dict to a file, each actor ``torch.load`` +
  ``load_state_dict`` (a shared file system standing in for the way weights reach other machines
  without an object store).

The two methods alternate, version by version; the first version of each is not timed (the
actors' first ``ray.get`` / file open).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from typing import Any

import torch
from torch import nn

from benchmarks.sync.worker import make_model
from fastlight.fleet.ray.sampler_actor import ActorWeights, StoreWeights


def checksum(policy: nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.double().sum() for p in policy.parameters()))


class Receiver:
    """A sampler actor's weight end, without the envs: its policy copy and fastlight's source."""

    def __init__(self, policy: nn.Module) -> None:
        torch.set_num_threads(1)
        self.policy = policy
        self.weights = ActorWeights()

    def load_ref(self, version: int, ref: list) -> int:
        self.weights.offer(version, ref[0])
        return self.weights.load_into(self.policy)

    def load_file(self, path: str) -> int:
        self.policy.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return 0

    def checksum(self) -> float:
        return checksum(self.policy)


def run(params: float, args: argparse.Namespace, ray: Any) -> dict[str, Any]:
    policy = make_model(int(params), torch.float32, "cpu", seed=0)  # benchmarks.sync's Linear stack
    n = sum(p.numel() for p in policy.parameters())
    actor = ray.remote(num_cpus=0, resources={"sim": 1})(Receiver)
    receivers = [actor.remote(policy) for _ in range(args.samplers)]
    ray.get([r.checksum.remote() for r in receivers])  # placed and built
    times: dict[str, list[float]] = {"ray_object_store": [], "ray_put": [], "checkpoint": []}
    store = StoreWeights(policy)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "weights.pt")
        for version in range(args.reps + 1):
            with torch.no_grad():  # a new version: every value changes
                for p in policy.parameters():
                    p.add_(1e-3)
            t0 = time.perf_counter()
            ref = store.put(ray, policy)
            t_put = time.perf_counter()
            ray.get([r.load_ref.remote(version, [ref]) for r in receivers])
            t1 = time.perf_counter()
            torch.save(policy.state_dict(), path)
            ray.get([r.load_file.remote(path) for r in receivers])
            t2 = time.perf_counter()
            del ref
            if version > 0:
                times["ray_object_store"].append(1000 * (t1 - t0))
                times["ray_put"].append(1000 * (t_put - t0))
                times["checkpoint"].append(1000 * (t2 - t1))
    want = checksum(policy)
    got = ray.get([r.checksum.remote() for r in receivers])
    assert all(math.isclose(g, want, rel_tol=1e-6) for g in got), (got, want)  # every copy is current
    for r in receivers:
        ray.kill(r)
    out: dict[str, Any] = {"params": n, "mb": 4 * n / 2**20, "samplers": args.samplers}
    for method, ms in times.items():
        out[method] = {"median_ms": statistics.median(ms), "ms": ms}
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=float, nargs="+", default=[1e6, 1e8])
    p.add_argument("--samplers", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.reps < 1 or args.samplers < 1:
        p.error(f"--reps and --samplers must be >= 1, got {args.reps} and {args.samplers}")
    import ray
    from ray.cluster_utils import Cluster

    # Object stores large enough for a few versions of the largest model: no spilling to disk.
    store = int(max(2 * 2**30, 6 * 4 * max(args.params)))
    head = {"num_cpus": 1, "include_dashboard": False, "object_store_memory": store}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.add_node(num_cpus=1, resources={"sim": args.samplers}, object_store_memory=store)
    ray.init(address=cluster.address, logging_level="warning")
    cluster.wait_for_nodes()
    try:
        results = [run(n, args, ray) for n in args.params]
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("| parameters | MB (float32) | samplers on node 2 | Ray object store, ms/version (median) | "
          "of it the trainer's put | checkpoint save + load, ms/version (median) | "
          "checkpoint / Ray |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in results:
        ray_ms, ckpt_ms = r["ray_object_store"]["median_ms"], r["checkpoint"]["median_ms"]
        put_ms = r["ray_put"]["median_ms"]
        print(f"| {r['params']:,} | {r['mb']:.0f} | {r['samplers']} | {ray_ms:.1f} | {put_ms:.1f} | "
              f"{ckpt_ms:.1f} | {ckpt_ms / ray_ms:.2f}x |")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            record = {"args": vars(args), "loadavg_1min": os.getloadavg()[0], "results": results}
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
