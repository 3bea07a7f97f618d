"""VLAPolicy(action_chunk=H): H x action_dim tokens per call, step-major, mapped to [N, H, D]."""

from __future__ import annotations

import pytest
import torch

from fastlight.models.action_mapping import BinsToActions, ChunkActions, action_chunk
from fastlight.sampling.collector import Collector
from fastlight.vla.policy import VLAPolicy
from tests.fake_envs import ActionEchoEnv

D, CHUNK, BINS = 3, 4, 16
TINY = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 32, "num_attention_heads": 2,
    "num_hidden_layers": 1, "n_bins": BINS, "action_dim": D, "proprio_dim": 4 + D, "max_text_len": 5,
    "value_mlp_hidden": 16, "max_episode_steps": 16,
}  # fmt: skip


def policy(**kw) -> VLAPolicy:
    torch.manual_seed(0)
    return VLAPolicy(**{**TINY, **kw}).eval()


def obs(n: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "proprio": torch.randn(n, 4 + D, generator=g),
        "instruction_ids": torch.randint(1, 60, (n, 5), generator=g),
    }


@pytest.mark.parametrize("decoding", ["parallel", "autoregressive"])
def test_a_chunk_is_h_times_d_tokens_scored_as_acted(decoding):
    p = policy(action_chunk=CHUNK, decoding=decoding)
    assert p.num_action_tokens == CHUNK * D and p.action_queries.shape[0] == CHUNK * D
    o, step = obs(), torch.tensor([0, 3, 7])
    with torch.no_grad():
        out = p.act(o, step=step)
        ev = p.evaluate(o, out.actions, step=step)
    assert out.actions.shape == out.logprobs.shape == ev.logprobs.shape == (3, CHUNK * D)
    torch.testing.assert_close(ev.logprobs, out.logprobs, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"K=12\] \(action_chunk 4 x action_dim 3\)"):
        p.evaluate(o, out.actions[:, :D], step=step)


def test_the_mapping_is_step_major_and_typed():
    p = policy(action_chunk=CHUNK)
    mapping = p.action_mapping()
    assert isinstance(mapping, ChunkActions) and action_chunk(mapping) == CHUNK
    bins = torch.randint(0, BINS, (2, CHUNK * D))
    env = p.bins_to_env_action(bins)
    assert env.shape == (2, CHUNK, D)
    for h in range(CHUNK):  # chunk step h is tokens h*D .. h*D + D - 1
        torch.testing.assert_close(env[:, h], p.action_tokenizer.decode(bins[:, h * D : (h + 1) * D]))


def test_action_chunk_one_is_todays_policy():
    a, b = policy(), policy(action_chunk=1)
    assert isinstance(b.action_mapping(), BinsToActions) and action_chunk(b.action_mapping()) is None
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    with torch.no_grad():
        torch.manual_seed(3)
        x = a.act(obs())
        torch.manual_seed(3)
        y = b.act(obs())
    assert torch.equal(x.actions, y.actions) and torch.equal(x.logprobs, y.logprobs)
    assert b.bins_to_env_action(y.actions).shape == (3, D)


def test_action_chunk_below_one_is_refused_naming_the_flag():
    with pytest.raises(
        ValueError, match=r"^--model.policy.init_args.action_chunk must be an int >= 1, got 0$"
    ):
        policy(action_chunk=0)


def test_the_sampler_executes_the_decoded_chunk_in_order():
    """ActionEchoEnv puts the action it received into the next observation: after a chunk of h steps,
    the echo is the decoded last executed step, tokens (h-1)*D .. h*D - 1 of the chunk."""
    p = policy(action_chunk=2)
    envs = [ActionEchoEnv(kind="vla", action_dim=D, length=5, vocab=60) for _ in range(2)]
    r = Collector(envs, mode="autoreset", rollout_steps=10).collect(p).validate()
    assert r.env_steps[:3].tolist() == [[2, 2], [2, 2], [1, 1]]  # episodes of 5 env steps: chunks 2, 2, 1
    decoded = p.bins_to_env_action(r.actions)  # [T, E, 2, D]
    for t in range(r.shape[0] - 1):
        for e in range(2):
            if r.terminated[t, e]:
                continue  # the next observation is a reset, not an echo
            last = int(r.env_steps[t, e]) - 1
            torch.testing.assert_close(r.obs["proprio"][t + 1, e, 4:], decoded[t, e, last])


def test_an_rl_update_with_self_imitation_trains_on_chunk_transitions():
    """VLAModule on a chunked Rollout: GIPO over the H x D tokens (``action`` ratios grouping the D
    tokens of each chunk step), and self-imitation storing and replaying the chunks' bins."""
    import lightning as L
    from torch.utils.data import DataLoader

    from fastlight.modules.minibatch import Minibatch
    from fastlight.vla.module import VLAModule
    from tests.lightning_helpers import quiet_trainer

    p = policy(action_chunk=2)
    envs = [ActionEchoEnv(kind="vla", action_dim=D, length=5, vocab=60) for _ in range(2)]
    r = Collector(envs, mode="dpsa", termination_threshold=1.0, max_horizon=20).collect(p).validate()
    assert r.terminated.any() and r.actions.shape[-1] == 2 * D
    m = VLAModule(policy=p, action_dim=D, sil_steps=1, sil_batch_size=4, num_minibatches=1, update_epochs=1,
                  ratio_granularity="action")  # fmt: skip
    assert m.tokens_per_action(torch.zeros(1, 2 * D)) == D  # one ratio per env action of the chunk
    p.train()
    before = {k: v.clone() for k, v in p.state_dict().items()}
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(m, train_dataloaders=DataLoader([r], batch_size=None))
    assert isinstance(trainer, L.Trainer) and m.policy_version == 1
    # Every transition of the two successful (terminated) episodes is in the buffer: 3 chunks each.
    assert len(m.success_buffer) == 6 and float(trainer.callback_metrics["sil/buffer_steps"]) == 6.0
    assert any(not torch.equal(before[k], v) for k, v in m.policy.state_dict().items())
    with torch.no_grad():
        adv, ret, values = m.compute_advantages(r)
    mb = Minibatch.from_rollout(r, adv, ret, values)
    out = m.evaluate_actions(mb.select(mb.valid.nonzero().squeeze(-1)))
    assert out.logprobs.shape == (6, 2 * D)


def test_tokens_per_action_is_checked_against_the_chunks_tokens_naming_the_allowed_values():
    """With chunks the ratio groups split K = H x D tokens, not D: 4 and 6 divide 12 (not 3) and are
    accepted; 5 is refused, naming the flag and the divisors of 12."""
    from fastlight.vla.module import VLAModule

    p = policy(action_chunk=CHUNK)
    for tpa in (4, 6, 12):
        VLAModule(policy=p, action_dim=D, ratio_granularity="action", tokens_per_action=tpa)
    msg = (
        r"^--model.tokens_per_action 5 must divide the policy's K=12 action tokens per call "
        r"\(action_chunk 4 x action_dim 3\) with --model.ratio_granularity action: one of "
        r"1, 2, 3, 4, 6, 12, or null \(the tokens of one env action\)$"
    )
    with pytest.raises(ValueError, match=msg):
        VLAModule(policy=p, action_dim=D, ratio_granularity="action", tokens_per_action=5)
    no_chunk = r"^--model.tokens_per_action 2 must divide the policy's K=3 action tokens per call with "
    with pytest.raises(
        ValueError, match=no_chunk + r"--model.ratio_granularity action: one of 1, 3, or null"
    ):
        VLAModule(policy=policy(), action_dim=D, ratio_granularity="action", tokens_per_action=2)
