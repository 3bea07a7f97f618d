"""``--trainer.strategy fsdp2`` (FSDP2 through Lightning's ModelParallelStrategy), two ranks on CPU
(gloo), end to end.

- Against DDP on the same data: with ``--data.max_staleness 0 --data.rank_rounds apart`` a highway
  run's batches are fixed by its seeds, so the two strategies see the same rollouts and must take the
  same first step's gradients and end at the same weights: FSDP2's reduce-scatter and DDP's all-reduce
  both average the ranks' gradients and differ only in summation order.
- The VLA (a Hugging Face backbone: each decoder layer its own unit, the policy the root): it trains,
  both ranks hold the same whole weights, the samplers' copies match every publish (the delivery
  check after every sync, which gathers the shards), and the checkpoint is one file of whole tensors
  that loads into a one-process module.
"""

from __future__ import annotations

import pytest
import torch

from fastlight.vla.module import VLAModule
from tests.modules.test_ddp import run_ddp

DETERMINISTIC = ("--data.max_staleness", "0", "--data.rank_rounds", "apart",
                 "--data.faults", "{verify_weights_every: 1}")  # fmt: skip
#: highway, 2 updates of 4 x 4 minibatches.
HIGHWAY = ("--data.env_id", "highway-fast-v0", "--data.num_envs", "2", "--data.num_workers", "1",
           "--data.max_horizon", "6", "--trainer.max_steps", "32", *DETERMINISTIC)  # fmt: skip
#: The MT10 state-only VLA from scratch, updates of 2 epochs x 2 minibatches of the whole loss (no
#: critic warm-up).
MT10 = ("--model.init_from", "null", "--data.env_kwargs", "{tasks: MT10, image: false, max_path_length: 6}",
        "--data.num_envs", "2", "--data.num_workers", "1", "--data.max_horizon", "6",
        "--data.cycles_per_step", "2", "--model.sil_steps", "0", "--model.value_warmup_updates", "0",
        *DETERMINISTIC)  # fmt: skip


def rank_weights(root, ranks=(0, 1)) -> list[dict[str, torch.Tensor]]:
    return [torch.load(root / "ranks" / f"rank{r}.pt") for r in ranks]


def assert_ranks_equal(weights: list[dict[str, torch.Tensor]]) -> None:
    a, b = weights
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.multiproc
@pytest.mark.ranks
def test_fsdp2_ends_where_ddp_does_on_the_same_data(tmp_path):
    ddp = run_ddp(tmp_path / "ddp", "examples/merge.yaml", *HIGHWAY)
    fsdp = run_ddp(tmp_path / "fsdp2", "examples/merge.yaml", *HIGHWAY, strategy="fsdp2")
    assert [r["version"] for r in ddp] == [r["version"] for r in fsdp] == [2, 2]
    assert [r["seeds"] for r in ddp] == [r["seeds"] for r in fsdp]
    wd, wf = rank_weights(tmp_path / "ddp"), rank_weights(tmp_path / "fsdp2")
    assert_ranks_equal(wd)
    assert_ranks_equal(wf)
    # Tolerance: float32 summation order in the gradient averages, through 32 Adam steps (measured: 1.4e-6
    # at most). An Adam step moves a weight by about lr = 3e-4 whatever the gradient's size, so a gradient
    # that is wrong, missing or not averaged over the ranks shows as ~1e-4 and more.
    apart = max((w - v).abs().max().item() for w, v in zip(wd[0].values(), wf[0].values(), strict=True))
    assert apart < 2e-5, apart
    assert wd[0].keys() == wf[0].keys()
    # The first optimizer step's gradients (the same batches; averaged over the ranks, then clipped), whole:
    # FSDP2's reduce-scatter against DDP's all-reduce. Tolerance: 2e-5 of the largest gradient (measured:
    # 1.75e-7 of 0.062, 2.8e-6, float32 summation order); a gradient not averaged over the two ranks'
    # different batches, or missing, is off by a sizeable fraction of it.
    gd, gf = (torch.load(tmp_path / run / "ranks" / "grads0.pt") for run in ("ddp", "fsdp2"))
    assert gd.keys() == gf.keys() == wd[0].keys()
    scale = max(g.abs().max().item() for g in gd.values())
    worst = max((gf[k] - gd[k]).abs().max().item() for k in gd)
    print(f"\nfirst step's gradients: largest {scale:.3g}, FSDP2 - DDP at most {worst:.3g}")
    assert worst < 2e-5 * scale, (worst, scale)


@pytest.mark.multiproc
@pytest.mark.ranks
def test_fsdp2_trains_the_vla_saves_one_checkpoint_file_and_resumes(tmp_path):
    config, path = "configs/vla_metaworld_mt10.yaml", tmp_path / "checkpoints" / "last.ckpt"
    run_ddp(tmp_path, config, *MT10, "--trainer.max_steps", "4", strategy="fsdp2")  # 1 update of 2 x 2
    first = torch.load(path, map_location="cpu", weights_only=False)
    # The optimizer state is saved whole too (Adam's moments shaped like the whole parameters).
    params = {k: v for k, v in first["state_dict"].items() if k.startswith("policy.")}
    moments = [s["exp_avg"] for s in first["optimizer_states"][0]["state"].values()]
    assert sorted(m.numel() for m in moments) == sorted(v.numel() for v in params.values())
    ranks = run_ddp(tmp_path, config, *MT10, "--trainer.max_steps", "8", "--ckpt_path", str(path),
                    strategy="fsdp2")  # fmt: skip
    assert [r["version"] for r in ranks] == [2, 2]  # the saved version 1, then one more
    weights = rank_weights(tmp_path)
    assert_ranks_equal(weights)
    # The checkpoint holds rank 0's whole weights and loads into one process.
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    saved = {k.removeprefix("policy."): v for k, v in ckpt["state_dict"].items() if k.startswith("policy.")}
    assert saved.keys() == weights[0].keys()
    for k, v in weights[0].items():
        torch.testing.assert_close(saved[k], v, rtol=0, atol=0)
    module = VLAModule.load_from_checkpoint(path, map_location="cpu")
    for k, p in module.policy.named_parameters():
        torch.testing.assert_close(p.detach(), weights[0][k], rtol=0, atol=0)
