"""Self-imitation: which steps are kept, the per-task buffer, and the VLAModule term that imitates them."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from fastlight.rollout import Rollout
from fastlight.vla.module import SIL_CHECKPOINT_KEY, VLAModule
from fastlight.vla.policy import VLAPolicy
from fastlight.vla.self_imitation import SuccessBuffer, successful_steps
from tests.lightning_helpers import quiet_trainer

POLICY = {
    "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "n_bins": 32,
    "proprio_dim": 5, "value_mlp_hidden": 16, "max_episode_steps": 32,
}  # fmt: skip


def random_flags(t_len: int, n_env: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Columns of back-to-back episodes that end terminated or truncated, then padding (the Rollout
    invariant: no padding inside an episode, a column's last valid step is done)."""
    g = torch.Generator().manual_seed(seed)
    term = torch.zeros(t_len, n_env, dtype=torch.bool)
    trunc = torch.zeros_like(term)
    valid = torch.zeros_like(term)
    for e in range(n_env):
        end = int(torch.randint(1, t_len + 1, (1,), generator=g))
        valid[:end, e] = True
        for t in range(end):
            if t == end - 1 or torch.rand((), generator=g) < 0.2:
                (term if torch.rand((), generator=g) < 0.5 else trunc)[t, e] = True
    return term, trunc, valid


def naive_successful_steps(term, trunc, valid) -> torch.Tensor:
    out = torch.zeros_like(term)
    for e in range(term.shape[1]):
        start = 0
        for t in range(term.shape[0]):
            if valid[t, e] and (term[t, e] or trunc[t, e]):
                if term[t, e]:
                    out[start : t + 1, e] = valid[start : t + 1, e]
                start = t + 1
    return out


@pytest.mark.parametrize("seed", range(5))
def test_successful_steps_match_a_per_episode_loop(seed):
    term, trunc, valid = random_flags(40, 7, seed)
    got = successful_steps(terminated=term, truncated=trunc, valid=valid)
    assert torch.equal(got, naive_successful_steps(term, trunc, valid))
    assert bool(got.any()) and bool((valid & ~got).any())  # the case holds both kinds of episode
    assert not bool((got & ~valid).any())


def test_successful_steps_refuse_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        flags = torch.zeros(3, 2, dtype=torch.bool)
        successful_steps(terminated=flags, truncated=flags[:, :1], valid=flags)


def rollout_of(term: torch.Tensor, trunc: torch.Tensor, valid: torch.Tensor, task: torch.Tensor) -> Rollout:
    """A Rollout with the given flags whose ``proprio[..., 0]`` numbers the steps ``0..T*E-1`` (so a
    kept step can be traced back) and whose action bins are ``(t + e) % 32`` on every token."""
    t_len, n_env = term.shape
    ids = torch.arange(t_len * n_env, dtype=torch.float32).reshape(t_len, n_env)
    proprio = torch.zeros(t_len, n_env, 5)
    proprio[..., 0] = ids
    bins = (torch.arange(t_len)[:, None] + torch.arange(n_env)[None]) % 32
    zeros = torch.zeros(t_len, n_env)
    return Rollout(
        obs={"proprio": proprio, "instruction_ids": torch.full((t_len, n_env, 3), 7)},
        actions=bins[..., None].expand(t_len, n_env, 4).clone(),
        logprobs=torch.full((t_len, n_env, 4), -3.0),
        values=zeros,
        rewards=zeros + valid.float(),
        terminated=term,
        truncated=trunc,
        valid=valid,
        step=torch.arange(t_len)[:, None].expand(t_len, n_env).clone() * valid,
        task_id=task,
        policy_version=torch.zeros(t_len, n_env, dtype=torch.long),
        bootstrap_values=zeros,
    ).validate()


def test_buffer_keeps_successful_steps_per_task_newest_first_out_last():
    term, trunc, valid = random_flags(30, 6, seed=3)
    task = torch.arange(6)[None].expand(30, 6) % 2
    r = rollout_of(term, trunc, valid, task)
    keep = successful_steps(terminated=term, truncated=trunc, valid=valid)
    buf = SuccessBuffer(capacity=10_000)
    assert buf.add_rollout(r) == int(keep.sum())
    assert buf.episodes_added == int((keep & term).sum())
    per_task = {t: int((keep & (task == t)).sum()) for t in (0, 1) if bool((keep & (task == t)).any())}
    assert buf.steps_per_task() == per_task
    # every kept step is one of the rollout's successful steps, with its own action bins
    obs, bins, valid = buf.sample(500, generator=torch.Generator().manual_seed(0))
    assert valid is None  # no action chunks: every token counts
    step_ids = obs["proprio"][:, 0].long()
    assert set(step_ids.tolist()) <= set(r.obs["proprio"][..., 0][keep].long().tolist())
    assert torch.equal(bins, r.actions.reshape(-1, 4)[step_ids])
    # FIFO: a small capacity keeps each task's newest steps
    small = SuccessBuffer(capacity=3)
    small.add_rollout(r)
    small.add_rollout(r)
    for t, n in small.steps_per_task().items():
        newest = r.obs["proprio"][..., 0][keep & (task == t)][-3:]
        assert n == min(3, per_task[t])
        assert torch.equal(small._tasks[t]["obs.proprio"][:, 0], newest)


def test_buffer_samples_tasks_uniformly_whatever_their_size():
    buf = SuccessBuffer(capacity=10_000)
    for task, n in ((0, 1000), (1, 10)):
        term = torch.zeros(n, 1, dtype=torch.bool)
        term[-1] = True
        r = rollout_of(term, torch.zeros_like(term), torch.ones_like(term), torch.full((n, 1), task))
        buf.add_rollout(r)
    obs, _, _ = buf.sample(4000, generator=torch.Generator().manual_seed(1))
    # task 1's 10 steps are numbered 0..9, as are the first 10 of task 0's 1000
    share_of_small_task = float((obs["proprio"][:, 0] < 10).float().mean())
    # half the draws go to task 1, plus task 0's first 10 steps (1% of its half): 0.505 +- 0.02
    assert abs(share_of_small_task - 0.505) < 0.03, share_of_small_task


def test_buffer_state_dict_round_trips_and_empty_buffer_is_refused():
    term, trunc, valid = random_flags(20, 4, seed=1)
    buf = SuccessBuffer(capacity=50)
    buf.add_rollout(rollout_of(term, trunc, valid, torch.zeros(20, 4, dtype=torch.long)))
    copy = SuccessBuffer(capacity=50)
    copy.load_state_dict(buf.state_dict())
    a = buf.sample(64, generator=torch.Generator().manual_seed(2))
    b = copy.sample(64, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a[0]["proprio"], b[0]["proprio"]) and torch.equal(a[1], b[1])
    assert copy.episodes_added == buf.episodes_added > 0
    with pytest.raises(ValueError, match="empty"):
        SuccessBuffer(capacity=5).sample(1)
    with pytest.raises(ValueError, match="capacity"):
        SuccessBuffer(capacity=0)


def chunk_rollout_of(term: torch.Tensor, trunc: torch.Tensor, valid: torch.Tensor, env_steps: torch.Tensor,
                     chunk: int, dims: int = 4) -> Rollout:  # fmt: skip
    """``rollout_of`` with action chunks of ``chunk x dims`` tokens: ``env_steps`` executed per
    transition, and bins ``(id + token) % 32`` (the transition ``id`` is its ``proprio[..., 0]``)."""
    t_len, n_env = term.shape
    base = rollout_of(term, trunc, valid, torch.zeros(t_len, n_env, dtype=torch.long))
    k = chunk * dims
    ids = base.obs["proprio"][..., 0].long()
    executed = (torch.arange(chunk) < env_steps[..., None]).float()  # [T, E, H]
    return Rollout(
        **{f: getattr(base, f) for f in ("obs", "values", "terminated", "truncated", "valid", "task_id")},
        actions=(ids[..., None] + torch.arange(k)) % 32,
        logprobs=torch.full((t_len, n_env, k), -3.0),
        rewards=executed.sum(-1),
        step=base.step * chunk,
        policy_version=base.policy_version,
        bootstrap_values=base.bootstrap_values,
        step_rewards=executed,
        env_steps=env_steps,
    ).validate()


def executed_tokens(env_steps: torch.Tensor, chunk: int, dims: int = 4) -> torch.Tensor:
    """``[T*E, K]`` bool, token by token: token ``j`` belongs to chunk step ``j // dims``."""
    flat = env_steps.reshape(-1).tolist()
    return torch.tensor([[j // dims < n for j in range(chunk * dims)] for n in flat])


def test_buffer_of_chunks_keeps_which_tokens_were_executed():
    chunk = 3
    term, trunc, valid = random_flags(30, 6, seed=4)
    g = torch.Generator().manual_seed(5)
    # full chunks inside an episode, 1..H env steps in the chunk that ends it, 0 on padding
    ends = torch.randint(1, chunk + 1, term.shape, generator=g)
    env_steps = torch.where(term | trunc, ends, torch.full_like(ends, chunk)) * valid
    r = chunk_rollout_of(term, trunc, valid, env_steps, chunk)
    keep = successful_steps(terminated=term, truncated=trunc, valid=valid)
    assert bool((keep & term & (env_steps < chunk)).any())  # some success ends inside a chunk
    buf = SuccessBuffer(capacity=10_000)
    assert buf.add_rollout(r) == int(keep.sum())
    expected = executed_tokens(env_steps, chunk)
    obs, bins, got = buf.sample(500, generator=torch.Generator().manual_seed(0))
    ids = obs["proprio"][:, 0].long()
    assert got is not None and got.dtype == torch.bool and got.shape == (500, chunk * 4)
    assert torch.equal(got, expected[ids]) and torch.equal(bins, r.actions.reshape(-1, chunk * 4)[ids])
    assert not bool(got.all()) and bool(got[:, :4].all())  # some tokens left out; step 0 always ran
    copy = SuccessBuffer(capacity=10_000)
    copy.load_state_dict(buf.state_dict())
    assert torch.equal(copy.sample(50, generator=torch.Generator().manual_seed(1))[2],
                       buf.sample(50, generator=torch.Generator().manual_seed(1))[2])  # fmt: skip
    plain = rollout_of(term, trunc, valid, torch.zeros_like(env_steps))
    with pytest.raises(ValueError, match="^SuccessBuffer: rollouts with and without action chunks"):
        buf.add_rollout(plain)


def test_sil_with_chunks_leaves_out_the_tokens_of_chunk_steps_never_executed(monkeypatch):
    """Env 0 succeeds 1 env step into its 4th chunk, env 1 is truncated: the self-imitation loss
    scores the 3 chunks of 3 steps whole and only the first step's 4 tokens of the last one."""
    import fastlight.vla.imitation_loss as imitation
    from fastlight.vla.imitation_loss import token_cross_entropy

    chunk = 3
    term = torch.zeros(4, 2, dtype=torch.bool)
    trunc = torch.zeros_like(term)
    term[-1, 0], trunc[-1, 1] = True, True
    env_steps = torch.full((4, 2), chunk)
    env_steps[-1, 0] = 1
    r = chunk_rollout_of(term, trunc, torch.ones_like(term), env_steps, chunk)
    calls: list[dict] = []

    def spy(**kw):
        calls.append(kw)
        return token_cross_entropy(**kw)

    monkeypatch.setattr(imitation, "token_cross_entropy", spy)
    torch.manual_seed(0)
    m = VLAModule(policy=VLAPolicy(**POLICY, action_chunk=chunk), action_dim=4, sil_steps=1,
                  sil_batch_size=64, update_epochs=1, num_minibatches=1)  # fmt: skip
    quiet_trainer(max_epochs=1).fit(m, train_dataloaders=DataLoader([r], batch_size=None))
    assert m.success_buffer.steps_per_task() == {0: 4}
    (call,) = calls
    ids = call["bins"][:, 0].cpu()  # bins of transition id start at id: ids 0, 2, 4, 6 are env 0's
    assert set(ids.tolist()) == {0, 2, 4, 6}  # the last chunk (id 6) was drawn
    expected = executed_tokens(env_steps, chunk)[ids]
    assert torch.equal(call["valid"].cpu(), expected) and int((~expected).sum()) == 8 * int((ids == 6).sum())
    logits, bins = call["logits"].detach(), call["bins"]
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), bins.flatten(), reduction="none")
    masked = ce[expected.flatten().to(ce.device)].mean()
    loss, _ = token_cross_entropy(logits=logits, bins=bins, valid=call["valid"])
    torch.testing.assert_close(loss, masked)
    assert not torch.allclose(ce.mean(), masked)  # the unexecuted tokens would change the loss


def sil_module(**kw) -> VLAModule:
    torch.manual_seed(0)
    settings = {"update_epochs": 1, "num_minibatches": 1, "lr": 3e-3, "sil_batch_size": 64, **kw}
    return VLAModule(policy=VLAPolicy(**POLICY), action_dim=4, **settings)


def one_success_rollout() -> Rollout:
    """Env 0 succeeds after 12 steps, env 1 is truncated after 12: only env 0's steps are imitated."""
    term = torch.zeros(12, 2, dtype=torch.bool)
    trunc = torch.zeros_like(term)
    term[-1, 0], trunc[-1, 1] = True, True
    return rollout_of(term, trunc, torch.ones_like(term), torch.zeros(12, 2, dtype=torch.long))


def success_logprob(m: VLAModule, r: Rollout) -> float:
    obs = {k: v[:, 0] for k, v in r.obs.items()}
    with torch.no_grad():
        out = m.policy.evaluate(obs, r.actions[:, 0], step=r.step[:, 0])
    return float(out.logprobs.mean())


def test_sil_steps_raise_the_probability_of_the_successful_episodes_actions():
    r = one_success_rollout()
    m = sil_module(sil_steps=4, sil_lr=3e-3)
    before = success_logprob(m, r)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(m, train_dataloaders=DataLoader([r] * 20, batch_size=None))
    assert m.success_buffer.steps_per_task() == {0: 12 * 20}  # env 0's 12 steps, once per update
    assert m.success_buffer.episodes_added == 20
    # one RL step + 4 self-imitation steps per update, on two optimizers
    assert trainer.global_step == 20 * (1 + 4) and m.optimizer_steps_per_update == 5
    after = success_logprob(m, r)
    # ln(1/32) = -3.47 per token at the start; measured -1.40 after 80 self-imitation steps
    assert before < -3.3 and after > -2.0, (before, after)
    logged = trainer.callback_metrics
    assert float(logged["sil/loss"]) < 2.0 and float(logged["sil/token_accuracy"]) > 0.3
    assert float(logged["sil/episodes"]) == 20.0
    # the same updates without self-imitation (the on-policy objective alone): measured -3.36
    plain = sil_module(sil_steps=0)
    quiet_trainer(max_epochs=1).fit(plain, train_dataloaders=DataLoader([r] * 20, batch_size=None))
    assert len(plain.success_buffer) == 0 and not isinstance(plain.optimizers(), list)
    assert success_logprob(plain, r) < -3.0


def test_sil_has_its_own_optimizer_and_learning_rate():
    m = sil_module(sil_steps=2, lr=1e-4, sil_lr=5e-4)
    rl, sil = m.configure_optimizers()
    assert [g["lr"] for g in rl.param_groups] == [1e-4, 1e-4] and isinstance(sil, torch.optim.AdamW)
    assert [(g["name"], g["lr"]) for g in sil.param_groups] == [("sil", 5e-4)]
    value = {id(p) for p in m.policy.value_parameters()}
    assert not value & {id(p) for p in sil.param_groups[0]["params"]}  # the critic is not imitated
    assert sil_module(sil_steps=2, lr=2e-4).configure_optimizers()[1].param_groups[0]["lr"] == 2e-4


def test_sil_waits_for_the_value_warmup_and_the_buffer_rides_in_the_checkpoint():
    r = one_success_rollout()
    m = sil_module(sil_steps=2, value_warmup_updates=3)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(m, train_dataloaders=DataLoader([r] * 2, batch_size=None))
    assert trainer.global_step == 2 and "sil/loss" not in trainer.callback_metrics  # critic warm-up
    checkpoint: dict = {}
    m.on_save_checkpoint(checkpoint)
    restored = sil_module(sil_steps=2)
    restored.on_load_checkpoint({**checkpoint, "state_dict": {}})
    assert restored.success_buffer.steps_per_task() == m.success_buffer.steps_per_task() == {0: 24}
    assert SIL_CHECKPOINT_KEY not in _saved(sil_module(sil_steps=0))


def _saved(m: VLAModule) -> dict:
    checkpoint: dict = {}
    m.on_save_checkpoint(checkpoint)
    return checkpoint


def test_bad_sil_settings_name_the_flag():
    for name, value in (("sil_steps", -1), ("sil_lr", 0.0), ("sil_batch_size", 0), ("sil_capacity", 0)):
        with pytest.raises(ValueError, match=f"--model.{name}"):
            sil_module(**{name: value})


def test_self_imitation_runs_on_every_rank_or_on_none(monkeypatch):
    """The steps run only where the strategy's all-ranks decision says every rank is ready (under
    DDP, Lightning's reduce_boolean_decision all-reduces it): a rank with successes skips them when
    another rank has none."""
    r = one_success_rollout()
    for others_ready in (True, False):
        m = sil_module(sil_steps=2)
        trainer = quiet_trainer(max_epochs=1)
        asked = []

        def decide(decision: bool, all: bool = True, others: bool = others_ready, asked: list = asked):
            asked.append((decision, all))
            return decision and others if all else decision or others

        monkeypatch.setattr(trainer.strategy, "reduce_boolean_decision", decide)
        trainer.fit(m, train_dataloaders=DataLoader([r] * 2, batch_size=None))
        assert asked == [(True, True), (True, True)]  # this rank had successes, "all" was asked
        assert len(m.success_buffer) == 24
        assert trainer.global_step == 2 * (1 + (2 if others_ready else 0)), others_ready
