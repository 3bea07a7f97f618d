"""SMPO under DDP: per-rank sum / (global count / world size), averaged by DDP, is the exact global mean."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastlight.losses import masked_mean


def shards():
    g = torch.Generator().manual_seed(0)
    # Uneven shards with different numbers of valid steps (and padding garbage).
    x = [torch.randn(7, generator=g), torch.randn(4, generator=g)]
    m = [torch.tensor([1, 1, 0, 1, 0, 0, 1], dtype=torch.bool), torch.tensor([1, 1, 1, 0], dtype=torch.bool)]
    x[0][~m[0]] = 1e6  # padding garbage (finite: NaN inputs poison any weight gradient, masked or not)
    return x, m


def rank_main(rank: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x, m = shards()
    w = torch.tensor(2.0, requires_grad=True)
    n = m[rank].sum().float()
    dist.all_reduce(n)  # what RLModule._global_count does
    loss = masked_mean(w * x[rank], m[rank], count=n / 2)
    loss.backward()
    grad = w.grad.clone()
    dist.all_reduce(grad)
    grad /= 2  # DDP's gradient averaging
    out.put((rank, float(grad)))
    dist.destroy_process_group()


@pytest.mark.multiproc
def test_ddp_average_of_smpo_losses_is_the_global_masked_mean():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    x, m = shards()
    w = torch.tensor(2.0, requires_grad=True)
    masked_mean(w * torch.cat(x), torch.cat(m)).backward()
    # d/dw of the global mean over all 7 valid steps, on both ranks.
    assert results[0] == pytest.approx(float(w.grad), abs=1e-6)
    assert results[1] == pytest.approx(float(w.grad), abs=1e-6)
