"""One update of a VLAPolicy over a Hugging Face VLM in bfloat16 on the CPU: in this process (the policy
cast to bf16, as Lightning's ``bf16-true`` does, and under ``torch.autocast``, as ``bf16-mixed`` does),
and through ``fastlight fit --trainer.precision bf16-true | bf16-mixed`` with its samplers (``slow``)."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import pytest
import torch

from benchmarks.tiny_vlm import save_tiny_vlm
from fastlight.envs.instructions import INSTRUCTIONS
from fastlight.losses import gipo_loss
from fastlight.vla.policy import VLAPolicy
from tests.instruction_ids import instruction_ids

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = tuple(INSTRUCTIONS.values())[:3]
N, SIDE = 6, 48


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("vlm") / "llava"
    return str(save_tiny_vlm("llava", folder, sentences=list(INSTRUCTIONS.values())))


def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids, mask = instruction_ids(SENTENCES, 16)
    rows = torch.arange(N) % len(SENTENCES)
    return {
        "image": torch.randint(0, 256, (N, SIDE, SIDE, 3), dtype=torch.uint8, generator=g),
        "proprio": torch.randn(N, 4, generator=g),
        "instruction_ids": ids[rows],
        "instruction_mask": mask[rows],
    }


def one_update(policy: VLAPolicy, obs: dict[str, torch.Tensor], *, autocast: bool) -> dict[str, float]:
    """Act, then one GIPO step on made-up advantages; returns what the test checks."""
    with torch.no_grad():
        behaviour = policy.eval().act(obs)
    policy.train()
    params = [q for q in policy.policy_parameters() if q.requires_grad]
    before = [q.detach().clone() for q in params]
    # Adam's first step moves every weight by ~lr: 1e-2 is above bf16's rounding of a weight near 1
    # (spacing 2^-7), so a norm weight at 1.0 moves in bf16-true too (at 1e-3 it would round back).
    opt = torch.optim.Adam(params, lr=1e-2)
    advantages = torch.linspace(-1.0, 1.0, N)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ev = policy.evaluate(obs, behaviour.actions)
        loss, info = gipo_loss(
            logprobs=ev.logprobs, old_logprobs=behaviour.logprobs, advantages=advantages,
            valid=torch.ones(N, dtype=torch.bool),
        )  # fmt: skip
    opt.zero_grad()
    loss.backward()
    opt.step()
    moved = sum(int(not torch.equal(a, b)) for a, b in zip(before, params, strict=True))
    ratio = float(info["ratio_mean"])
    return {"loss": float(loss.detach()), "ratio_mean": ratio, "moved": moved, "n": len(params)}


@pytest.mark.parametrize("mode", ["bf16-true", "bf16-mixed"])
def test_one_bf16_update_in_process(llava, mode):
    torch.manual_seed(0)
    policy = VLAPolicy(backbone=llava, action_dim=4, proprio_dim=4, image_size=SIDE)
    ids, mask = instruction_ids(SENTENCES, 16)
    assert policy.bind_instructions(SENTENCES, ids, mask)
    if mode == "bf16-true":
        policy = policy.to(torch.bfloat16)
        assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    got = one_update(policy, batch(), autocast=mode == "bf16-mixed")
    assert math.isfinite(got["loss"])
    # On-policy: the ratio is 1 up to bf16 rounding of the logits (8 mantissa bits: ~0.4 % per logit).
    assert abs(got["ratio_mean"] - 1.0) < 0.05, got
    # Every trainable tensor got a gradient and moved (the frozen vision tower is not among them).
    assert got["moved"] == got["n"] > 0, got


def _metrics(run: Path) -> list[dict[str, str]]:
    (path,) = run.glob("csv/version_*/metrics.csv")
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # two fit runs with a spawned sampler each (~40 s each on 2 cores)
@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16-true", torch.bfloat16), ("bf16-mixed", torch.float32)]
)
def test_fit_runs_an_update_in_bf16(llava, tmp_path, precision, dtype):
    import subprocess
    import sys

    fastlight = Path(sys.executable).parent / "fastlight"
    cmd = [
        str(fastlight), "fit", "--config", "configs/vla_metaworld_reach.yaml",
        "--model.policy.init_args.backbone", llava, "--trainer.precision", precision,
        "--trainer.max_steps", "2", "--data.num_envs", "2", "--data.num_workers", "1",
        "--data.max_horizon", "10", "--data.env_kwargs.max_path_length", "10",
        "--model.num_minibatches", "1", "--model.update_epochs", "1",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [r for r in _metrics(tmp_path) if r.get("loss/total")]
    assert len(rows) == 2 and all(math.isfinite(float(r["loss/total"])) for r in rows)
    # The first minibatch of a rollout is on-policy: bf16 rounding only (the samplers act in the
    # trainer's precision: Lightning converts the module before the samplers copy it).
    assert abs(float(rows[0]["loss/ratio_mean"]) - 1.0) < 0.05, rows[0]
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    decoder = [v for k, v in state["state_dict"].items() if ".layers.0.self_attn.q_proj." in k]
    assert decoder and {v.dtype for v in decoder} == {dtype}


def resave_in_bf16(folder: Path, auto_class: type) -> None:
    """The folder's weights as real checkpoints ship them: bfloat16 (its config's dtype too)."""
    auto_class.from_pretrained(folder).to(torch.bfloat16).save_pretrained(folder)


def test_a_bf16_folder_trains_with_fp32_weights(tmp_path):
    import transformers

    from benchmarks.tiny_vlm import save_tiny_pi0
    from fastlight.vla.flow_policy import FlowVLAPolicy

    vlm = save_tiny_vlm("llava", tmp_path / "llava", sentences=list(SENTENCES))
    resave_in_bf16(vlm, transformers.AutoModelForImageTextToText)
    pi0 = save_tiny_pi0(tmp_path / "pi0", sentences=list(SENTENCES))
    resave_in_bf16(pi0, transformers.PI0ForConditionalGeneration)
    # What transformers alone gives (dtype="auto"): bf16 master weights, where an Adam step of lr 5e-6
    # (RLinf's) on a weight near 1 rounds away (bf16's spacing there is 2^-7).
    raw = transformers.AutoModelForImageTextToText.from_pretrained(vlm)
    assert {p.dtype for p in raw.parameters()} == {torch.bfloat16}
    for policy in (
        VLAPolicy(backbone=str(vlm), action_dim=4, proprio_dim=4, image_size=SIDE),
        FlowVLAPolicy(backbone=str(pi0), action_dim=3, action_chunk=2, proprio_dim=5, max_text_len=6),
    ):
        assert {p.dtype for p in policy.parameters() if p.is_floating_point()} == {torch.float32}
        weight = next(p for n, p in policy.named_parameters() if "norm" in n and p.requires_grad)
        before = weight.detach().clone()
        opt = torch.optim.Adam([weight], lr=5e-6)
        weight.sum().backward()
        opt.step()
        assert (weight.detach() - before).abs().min() > 4e-6  # every entry moved by about lr
