"""FlowVLAPolicy: pi0 through flow-SDE (πRL), on a tiny random pi0 folder (benchmarks.tiny_vlm).

The folder's chunk (4 x 4) is larger than what the policy executes (H=2 x D=3), so the padded chunk steps
and action dims are exercised everywhere.
"""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.tiny_vlm import save_tiny_pi0, save_tiny_vlm
from fastlight.losses.gipo import gipo_loss
from fastlight.models.base import FlowPolicy, TokenPolicy
from fastlight.vla.flow_policy import FlowVLAPolicy

ROOT = Path(__file__).resolve().parents[2]
FASTLIGHT = Path(sys.executable).parent / "fastlight"
SENTENCES = ("reach the goal", "push the puck")
H, D, P, STEPS = 2, 3, 5, 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("pi0") / "pi0"
    return str(save_tiny_pi0(out, sentences=SENTENCES, chunk_size=4, action_dim=4, state_dim=8))


def policy(folder: str, **kw) -> FlowVLAPolicy:
    torch.manual_seed(0)
    args = {"action_dim": D, "action_chunk": H, "num_steps": STEPS, "proprio_dim": P, "max_text_len": 6,
            "value_mlp_hidden": 16, **kw}  # fmt: skip
    return FlowVLAPolicy(backbone=folder, **args)


def obs(n: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, 6, dtype=torch.long)
    mask[::2, 4:] = 0  # right padding on every other row
    return {"instruction_ids": torch.randint(1, 30, (n, 6), generator=g) * mask, "instruction_mask": mask,
            "proprio": torch.randn(n, P, generator=g)}  # fmt: skip


def naive_logprob(p: FlowVLAPolicy, o: dict, actions: torch.Tensor) -> torch.Tensor:
    """One sample at a time, one stochastic step at a time, πRL's mean written as its x0 / x1 weights."""
    k0, states = p._unpack(actions)
    rows = []
    for i in range(actions.shape[0]):
        prefix = p._prefix({key: v[i : i + 1] for key, v in o.items()})
        total = torch.zeros(p.chunk_shape, dtype=torch.float64)
        for j in range(states.shape[1] - 1):
            k = int(k0[i]) + j
            x = states[i : i + 1, j]
            v = p._expert(prefix, x, torch.tensor([k]))[0][0].double()
            x = x[0].double()
            t, delta = 1 - k / STEPS, 1 / STEPS
            sigma = p.noise_level * math.sqrt(t / (1 - (t if k else 1 - delta)))
            x0, x1 = x - v * t, x + v * (1 - t)
            mean = x0 * (1 - (t - delta)) + x1 * (t - delta - sigma**2 * delta / (2 * t))
            std = math.sqrt(delta) * sigma
            nxt = states[i, j + 1].double()
            total += -((nxt - mean) ** 2) / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)
        rows.append(total[:H, :D].reshape(-1))
    return torch.stack(rows).float()


@pytest.mark.parametrize("sde_steps", ["one", "all"])
def test_evaluate_is_the_naive_per_step_log_likelihood(folder, sde_steps):
    p = policy(folder, sde_steps=sde_steps)
    o = obs()
    out = p.act(o)
    assert out.actions.shape == (4, H * D + 1 + p.stored_states * 16) and out.logprobs.shape == (4, H * D)
    with torch.no_grad():
        ev = p.evaluate(o, out.actions)
        naive = naive_logprob(p, o, out.actions)
    torch.testing.assert_close(ev.logprobs, naive, atol=1e-4, rtol=1e-4)
    # Unchanged weights: the learner's log-probs are the sampler's (same kernels; batch rows differ in t).
    torch.testing.assert_close(ev.logprobs, out.logprobs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ev.values, out.values)
    torch.testing.assert_close(p.value(o), out.values)  # the state token ignores the chain
    assert ev.entropy.shape == (4, H * D) and torch.isfinite(ev.entropy).all()


def test_the_stored_chain_reproduces_the_executed_actions_bit_for_bit(folder):
    p = policy(folder, sde_steps="one")
    o = obs(6)
    torch.manual_seed(3)
    out = p.act(o)
    first, states = p._unpack(out.actions)
    assert first.unique().numel() > 1  # samples draw their own stochastic step
    with torch.no_grad():  # the ODE from x_{k+1} to the end, as act ran it: the same batch and kernels
        prefix, x = p._prefix(o), states[:, 1]
        for j in range(STEPS):
            step = torch.full((6,), j)
            x = torch.where((step > first)[:, None, None], x - p._expert(prefix, x, step)[0] / STEPS, x)
    env = p.env_action(out.actions)
    assert env.shape == (6, H, D)
    assert torch.equal(env, x[:, :H, :D].clamp(-1, 1))
    every = policy(folder, sde_steps="all").act(o)
    chain = every.actions[:, H * D + 1 :].reshape(6, STEPS + 1, 4, 4)
    assert torch.equal(every.actions[:, : H * D], chain[:, -1, :H, :D].reshape(6, -1))


def test_every_trainable_parameter_gets_a_gradient(folder):
    """DDP stops on trainable parameters without gradients: the unused ones are frozen."""
    p = policy(folder)
    o = obs()
    ev = p.evaluate(o, p.act(o).actions)
    (ev.logprobs.sum() + ev.values.sum()).backward()
    assert [n for n, q in p.named_parameters() if q.requires_grad and q.grad is None] == []
    assert p.value_head.score.weight.grad is not None and p.backbone.action_out_proj.weight.grad is not None


def test_images_and_lora(folder):
    """``image_size`` feeds the camera through the folder's image processor and SigLIP tower; ``lora``
    adapts the VLM's language model and the expert, the rest of both frozen. Either way every trainable
    parameter gets a gradient (DDP) and the learner scores the chain as it was sampled."""
    g = torch.Generator().manual_seed(1)
    images = [torch.randint(0, 256, (4, 32, 32, 3), dtype=torch.uint8, generator=g) for _ in range(2)]
    lora = {"r": 2, "target_modules": ["q_proj", "v_proj"]}
    for p, o in (
        (policy(folder, image_size=32), obs() | {"image": images[0]}),
        (policy(folder, lora=lora), obs()),
    ):
        out = p.act(o)
        ev = p.evaluate(o, out.actions)
        torch.testing.assert_close(ev.logprobs, out.logprobs, atol=1e-5, rtol=1e-5)
        (ev.logprobs.sum() + ev.values.sum()).backward()
        assert [n for n, q in p.named_parameters() if q.requires_grad and q.grad is None] == []
    camera = policy(folder, image_size=32)
    assert not torch.equal(camera.value(o | {"image": images[0]}), camera.value(o | {"image": images[1]}))
    trainable = [n for n, q in p.named_parameters() if q.requires_grad and ".layers." in n]
    assert trainable and all("lora_" in n for n in trainable)


def test_deterministic_acting_runs_the_ode(folder):
    p = policy(folder)
    o = obs()
    out = p.act(o, deterministic=True)
    first, states = p._unpack(out.actions)
    with torch.no_grad():
        v = p._expert(p._prefix(o), states[:, 0], first)[0]
    torch.testing.assert_close(states[:, 1], states[:, 0] - v / STEPS)


def test_a_policy_that_ran_pickles_and_its_copy_scores_the_same(folder):
    """What a spawned inference worker gets: the policy after it acted (transformers' capture hooks
    installed); the unpickled copy rescores the stored chain as the original does."""
    p = policy(folder).eval()
    o = obs()
    with torch.no_grad():
        out = p.act(o)
        q = pickle.loads(pickle.dumps(p))
        mine, theirs = p.evaluate(o, out.actions), q.evaluate(o, out.actions)
    torch.testing.assert_close(theirs.logprobs, mine.logprobs, rtol=0, atol=1e-6)  # same kernels and shapes
    torch.testing.assert_close(theirs.values, mine.values, rtol=0, atol=1e-6)


def test_a_gipo_update_raises_the_likelihood_of_positive_advantage_chunks(folder):
    """A one-step bandit: half the sampled chunks get advantage +1, half -1."""
    p = policy(folder, sde_steps="one")
    o = obs(8)
    out = p.act(o)
    adv = torch.tensor([1.0, -1.0] * 4)
    opt = torch.optim.Adam([q for q in p.policy_parameters() if q.requires_grad], lr=3e-3)
    for _ in range(5):
        loss, _ = gipo_loss(logprobs=p.evaluate(o, out.actions).logprobs, old_logprobs=out.logprobs,
                            advantages=adv, valid=torch.ones(8, dtype=torch.bool))  # fmt: skip
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        gain = (p.evaluate(o, out.actions).logprobs - out.logprobs).sum(-1)
    assert gain[adv > 0].mean() > 0 > gain[adv < 0].mean()


def test_flow_matching_loss_counts_only_the_valid_executed_entries(folder):
    """SFT's loss of a flow policy is pi0's own flow-matching loss, a mean over the valid executed entries:
    the actions of a sample with no valid step never count (within a sample the expert sees the whole
    noisy chunk, as pi0 trains), and the mask changes the mean."""
    from fastlight.vla.sft import VLASFTModule

    p = policy(folder)
    assert isinstance(p, FlowPolicy) and not isinstance(p, TokenPolicy)
    m = VLASFTModule(policy=p, action_dim=D)
    acts = torch.rand(4, H, D) * 2 - 1
    valid = torch.tensor([[True, True], [True, False], [True, True], [False, False]])
    changed = acts.clone()
    changed[3] = 0.7  # the sample without a valid step
    losses = []
    for a, v in ((acts, valid), (changed, valid), (acts, torch.ones_like(valid))):
        torch.manual_seed(1)  # the same noise and times
        loss, _ = m.token_loss({"obs": obs(), "actions": a, "valid": v})
        losses.append(loss)
    assert losses[0] > 0 and torch.equal(losses[0], losses[1]) and losses[0] != losses[2]
    losses[0].backward()
    assert p.backbone.action_out_proj.weight.grad is not None and p.value_head.score.weight.grad is None


def test_self_imitation_replays_the_executed_chunks_of_successes(folder):
    """VLAModule with sil_steps on a chunked flow Rollout: GIPO over the H x D entries, then flow matching
    on the buffered successes' executed chunks, without the chunk step the env never ran."""
    from torch.utils.data import DataLoader

    from fastlight.rollout import Rollout
    from fastlight.vla.module import VLAModule
    from tests.lightning_helpers import quiet_trainer

    p = policy(folder)
    t_len, e = 3, 2
    o = obs(t_len * e)
    out = p.act(o)
    term = torch.zeros(t_len, e, dtype=torch.bool)
    term[-1] = True
    zeros = torch.zeros(t_len, e)
    env_steps = torch.full((t_len, e), H)
    env_steps[-1] = 1  # the episodes end inside their last chunk
    r = Rollout(
        obs={k: v.reshape(t_len, e, *v.shape[1:]) for k, v in o.items()},
        actions=out.actions.reshape(t_len, e, -1), logprobs=out.logprobs.reshape(t_len, e, -1),
        values=out.values.reshape(t_len, e), rewards=zeros + 1.0, terminated=term,
        truncated=torch.zeros_like(term), valid=torch.ones_like(term),
        step=torch.arange(t_len)[:, None].expand(t_len, e).clone(), task_id=zeros.long(),
        policy_version=zeros.long(), bootstrap_values=zeros,
        step_rewards=torch.zeros(t_len, e, H), env_steps=env_steps,
    ).validate()  # fmt: skip
    m = VLAModule(policy=p, action_dim=D, sil_steps=1, sil_batch_size=4, num_minibatches=1, update_epochs=1)
    before = p.backbone.action_out_proj.weight.detach().clone()
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(m, train_dataloaders=DataLoader([r], batch_size=None))
    assert m.policy_version == 1 and len(m.success_buffer) == t_len * e
    assert float(trainer.callback_metrics["sil/loss"]) > 0
    assert not torch.equal(before, p.backbone.action_out_proj.weight)
    _, _, valid = m.success_buffer.sample(8)
    assert valid.shape == (8, H * D)  # per executed entry, from the log-probs (the actions are chains)


def test_bad_settings_are_refused_in_one_line(folder, tmp_path):
    from fastlight.vla.policy import VLAPolicy

    cases = [
        ({"sde_steps": "two"}, "--model.policy.init_args.sde_steps must be one of one, all, got 'two'"),
        ({"sde_logprob": "max"}, "--model.policy.init_args.sde_logprob must be sum or mean, got 'max'"),
        ({"noise_level": 0.0}, "--model.policy.init_args.noise_level must be > 0"),
        ({"action_chunk": 5}, "--model.policy.init_args.action_chunk=5 exceeds the pi0 model's chunk_size=4"),
        ({"proprio_dim": 9}, "init_args.proprio_dim=9 exceeds the pi0 model.s max_state_dim=8"),
        ({"num_steps": 0}, "--model.policy.init_args.num_steps must be an int >= 1, got 0"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg.replace("(", r"\(")):
            policy(folder, **kw)
    llava = save_tiny_vlm("llava", tmp_path / "llava", sentences=SENTENCES, n_bins=8)
    refused = r"not a PI0Config or PI05Config: FlowVLAPolicy loads pi0 and pi0.5 folders; use "
    refused += r".*\.VLAPolicy for this one$"
    with pytest.raises(ValueError, match=refused):
        FlowVLAPolicy(backbone=str(llava))
    with pytest.raises(ValueError, match=r"a pi0 folder \(flow matching\) loads with .*FlowVLAPolicy"):
        VLAPolicy(backbone=folder)
    p = policy(folder)
    with pytest.raises(ValueError, match=r"packed float chains \[N, 39\]"):
        p.evaluate(obs(), torch.zeros(4, H * D, dtype=torch.long))


@pytest.mark.slow  # three CLI runs (about 2 minutes on 2 cores)
@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_fit_evaluate_and_resume_from_a_pi0_folder(tmp_path, kind):
    from benchmarks.tiny_vlm import save_tiny_pi05
    from fastlight.envs.instructions import INSTRUCTIONS

    save = save_tiny_pi0 if kind == "pi0" else save_tiny_pi05
    pi0 = save(tmp_path / kind, sentences=list(INSTRUCTIONS.values()))
    root = tmp_path / "run"
    fit = [
        str(FASTLIGHT), "fit", "--config", "configs/vla_metaworld_flow.yaml",
        "--model.policy.init_args.backbone", str(pi0), "--model.policy.init_args.num_steps", "3",
        "--data.num_envs", "2", "--data.num_workers", "1", "--data.max_horizon", "8",
        "--model.num_minibatches", "1", "--model.update_epochs", "1", "--model.sil_steps", "1",
        "--trainer.default_root_dir", str(root), "--data.start_method", "spawn",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "FASTLIGHT_DEBUG"}

    def run(args: list[str]) -> str:
        done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    run([*fit, "--trainer.max_steps", "2"])
    ckpt = root / "checkpoints" / "last.ckpt"
    assert int(torch.load(ckpt, weights_only=False)["state_dict"]["_policy_version"]) == 2
    said = run([str(FASTLIGHT), "evaluate", "--ckpt", str(ckpt), "--episodes", "2"])
    assert "success rate" in said
    run([*fit, "--trainer.max_steps", "4", "--ckpt_path", "last"])
    assert torch.load(ckpt, weights_only=False)["global_step"] == 4


@pytest.mark.parametrize("train_padding", [True, False])
def test_flow_matching_loss_trains_the_padded_entries_unless_told(folder, train_padding):
    """Against pi0's own per-entry loss on the same noise and times: the mean over the valid executed
    entries plus (train_padding) every padded chunk step and action dim of a sample with a valid entry."""
    p = policy(folder, train_padding=train_padding)
    o, acts = obs(), torch.rand(4, H * D) * 2 - 1
    valid = torch.tensor([[True] * D + [False] * D, [True] * (H * D), [False] * (H * D), [True] * (H * D)])
    torch.manual_seed(3)
    got, _ = p.flow_matching_loss(o, acts, valid)
    torch.manual_seed(3)
    cache, mask, state = p._prefix(o)
    target = state.new_zeros(4, *p.chunk_shape)
    target[:, :H, :D] = acts.reshape(4, H, D)
    full = p.backbone(state=state, actions=target, attention_mask=mask, cache=cache).loss.float()  # [N, C, M]
    total, count = 0.0, 0
    for i in range(4):
        for c in range(p.chunk_shape[0]):
            for m in range(p.chunk_shape[1]):
                executed = c < H and m < D
                keep = bool(valid[i, c * D + m]) if executed else train_padding and bool(valid[i].any())
                total, count = total + float(full[i, c, m]) * keep, count + keep
    torch.testing.assert_close(got.item(), total / count, rtol=1e-5, atol=1e-6)


def test_sde_logprob_mean_is_the_sum_over_the_chain_divided_by_its_steps(folder):
    torch.manual_seed(0)
    summed = policy(folder, sde_steps="all")
    mean = policy(folder, sde_steps="all", sde_logprob="mean")
    mean.load_state_dict(summed.state_dict())
    o = obs()
    out = summed.act(o)
    with torch.no_grad():
        a, b = summed.evaluate(o, out.actions), mean.evaluate(o, out.actions)
    torch.testing.assert_close(b.logprobs * STEPS, a.logprobs, rtol=1e-5, atol=1e-5)
    # One stochastic step: nothing to average, the setting changes nothing.
    assert policy(folder, sde_steps="one", sde_logprob="mean").logprob_steps == 1


@pytest.fixture(scope="module")
def pi05_folder(tmp_path_factory) -> str:
    from benchmarks.tiny_vlm import save_tiny_pi05

    return str(save_tiny_pi05(tmp_path_factory.mktemp("pi05") / "pi05", sentences=SENTENCES, chunk_size=4))


def bound(folder: str, **kw) -> FlowVLAPolicy:
    from tests.instruction_ids import instruction_ids

    p = policy(folder, **kw)
    ids, mask = instruction_ids(SENTENCES, 6)
    assert p.bind_instructions(SENTENCES, ids, mask)
    return p


def pi05_obs(p: FlowVLAPolicy, proprio: torch.Tensor) -> dict[str, torch.Tensor]:
    rows = torch.arange(proprio.shape[0]) % len(SENTENCES)
    keys = p.retokenizer.row_keys.cpu()
    return {
        "instruction_ids": keys.clamp(min=0)[rows],
        "instruction_mask": (keys >= 0).long()[rows],
        "proprio": proprio,
    }


def test_pi05_writes_the_state_into_its_prompt_and_trains_like_pi0(pi05_folder):
    """pi0.5: the prompt is its processor's (the state in 256 bins), the learner scores the sampler's chains
    exactly, the state changes the actions and the value, and SFT and RL reach every trainable weight."""
    from transformers import AutoConfig

    assert type(AutoConfig.from_pretrained(pi05_folder)).__name__ == "PI05Config"
    p = bound(pi05_folder, sde_steps="all")
    assert p.pi05 and p.prompt is not None
    state = torch.tensor([[-1.0, -0.5, 0.0, 0.5, 0.999]])
    assert p.prompt.prompts(["push_the puck"], state) == [
        "<bos>Task: push the puck, State: 0 64 128 192 255;\nAction: "
    ]
    g = torch.Generator().manual_seed(0)
    o = pi05_obs(p, torch.rand(4, P, generator=g) * 2 - 1)
    torch.manual_seed(1)
    out = p.act(o)
    with torch.no_grad():
        ev = p.evaluate(o, out.actions)
    torch.testing.assert_close(ev.logprobs, out.logprobs, atol=1e-5, rtol=1e-5)
    other = {**o, "proprio": -o["proprio"]}
    torch.manual_seed(1)  # the same noise: only the state differs
    moved = p.act(other)
    assert not torch.allclose(moved.actions[:, : H * D], out.actions[:, : H * D])
    assert not torch.allclose(p.value(other), p.value(o))
    loss, _ = p.flow_matching_loss(o, torch.rand(4, H * D) * 2 - 1)
    ev = p.evaluate(o, out.actions)
    (loss - (ev.logprobs.mean() + ev.values.mean())).backward()
    missing = [n for n, q in p.named_parameters() if q.requires_grad and q.grad is None]
    assert missing == [], missing
