"""PPO / GIPO / SAPO objectives: SMPO padding invariance, gradient formulas, granularity, errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fastlight.losses import gipo_loss, log_ratio, ppo_clip_loss, sapo_loss

NAN = float("nan")
OBS, VOCAB, K = 5, 6, 4
#: The policy losses by name, each ``(loss, info)`` of the same keyword-only inputs.
OBJECTIVES = {"ppo": ppo_clip_loss, "gipo": gipo_loss, "sapo": sapo_loss}


# ---------------------------------------------------------------------------- helpers
def _token_logprobs(policy: nn.Linear, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """[N, K] log-probs of K action tokens from a linear 'VLA head' (one categorical per token)."""
    logits = policy(obs).reshape(obs.shape[0], K, VOCAB)
    return logits.log_softmax(-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def _batch(n: int, seed: int, policy: nn.Linear) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, OBS, generator=g, dtype=torch.float64)
    actions = torch.randint(0, VOCAB, (n, K), generator=g)
    with torch.no_grad():
        current = _token_logprobs(policy, obs, actions)
    # Behaviour log-probs off by up to ±0.5 nats so that some ratios fall outside [0.8, 1.2].
    old = current + (torch.rand(n, K, generator=g, dtype=torch.float64) - 0.5)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    return {"obs": obs, "actions": actions, "old": old, "adv": adv, "valid": torch.ones(n, dtype=torch.bool)}


def _garbage(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # Observations must be finite (a NaN *input* to the network poisons W.grad = δᵀ·x whatever the
    # loss does), but everything the loss reads directly is NaN/inf.
    obs = 1e3 * torch.randn(n, OBS, generator=g, dtype=torch.float64)
    old = torch.full((n, K), NAN, dtype=torch.float64)
    old[::2] = -float("inf")
    adv = torch.full((n,), NAN, dtype=torch.float64)
    adv[1::2] = float("inf")
    actions = torch.randint(0, VOCAB, (n, K), generator=g)
    return {"obs": obs, "actions": actions, "old": old, "adv": adv, "valid": torch.zeros(n, dtype=torch.bool)}


def _cat(a: dict, b: dict, perm: torch.Tensor | None = None) -> dict:
    out = {k: torch.cat([a[k], b[k]]) for k in a}
    return out if perm is None else {k: v[perm] for k, v in out.items()}


def _loss_and_grads(policy: nn.Linear, batch: dict, objective: str, granularity: str, reduce_tokens: bool):
    policy.zero_grad()
    lp = _token_logprobs(policy, batch["obs"], batch["actions"])
    old = batch["old"]
    if reduce_tokens:  # an [N] log-prob (e.g. a continuous or single-token policy)
        lp, old = lp.sum(-1), old.sum(-1)
    kwargs = {"granularity": granularity, "tokens_per_action": 2}
    loss, info = OBJECTIVES[objective](
        logprobs=lp, old_logprobs=old, advantages=batch["adv"], valid=batch["valid"], **kwargs
    )
    loss.backward()
    return loss.detach(), info, [p.grad.clone() for p in policy.parameters()]


def _policy(seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(OBS, K * VOCAB).double()


# ---------------------------------------------------------------------------- SMPO invariance
@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
@pytest.mark.parametrize(
    ("granularity", "reduce_tokens"), [("token", False), ("action", False), ("chunk", False), ("token", True)]
)
@pytest.mark.parametrize("n_pad", [1, 7])
def test_padding_leaves_loss_and_grads_unchanged(
    objective: str, granularity: str, reduce_tokens: bool, n_pad: int
) -> None:
    policy = _policy()
    real = _batch(6, seed=1, policy=policy)
    ref_loss, ref_info, ref_grads = _loss_and_grads(policy, real, objective, granularity, reduce_tokens)
    assert all(g.abs().sum() > 0 for g in ref_grads)  # the check below is not vacuous

    padded = _cat(real, _garbage(n_pad, seed=2))
    shuffled = _cat(real, _garbage(n_pad, seed=3), perm=torch.randperm(6 + n_pad))
    for batch in (padded, shuffled):
        loss, info, grads = _loss_and_grads(policy, batch, objective, granularity, reduce_tokens)
        torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-6)
        for g, ref in zip(grads, ref_grads, strict=True):
            assert torch.isfinite(g).all()
            torch.testing.assert_close(g, ref, rtol=0, atol=1e-6)
        for key, value in ref_info.items():
            torch.testing.assert_close(info[key], value, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------- gradient formulas
def _leaf_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(8, K, generator=g, dtype=torch.float64)
    lp = (old + torch.randn(8, K, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(8, generator=g, dtype=torch.float64)
    valid = torch.tensor([True] * 6 + [False] * 2)
    return lp, old, adv, valid


def test_gipo_gradient_is_minus_w_r_a_with_w_detached() -> None:
    lp, old, adv, valid = _leaf_inputs()
    sigma = 0.5
    loss, info = gipo_loss(logprobs=lp, old_logprobs=old, advantages=adv, valid=valid, sigma=sigma)
    (grad,) = torch.autograd.grad(loss, lp)

    log_r = (lp - old).detach()
    r, w, a = log_r.exp(), torch.exp(-0.5 * (log_r / sigma) ** 2), adv[:, None].expand(-1, K)
    n_valid_tokens = int(valid.sum()) * K
    expected = torch.where(valid[:, None], -w * r * a / n_valid_tokens, 0.0)
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)
    ref_loss = (-w * r * a)[valid].mean()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(info["trust_weight_mean"], w[valid].mean())

    # If w were not detached the gradient would carry an extra -w·r·A·(-log r/σ²) term.
    log_r_live = lp - old
    undetached = (-torch.exp(-0.5 * (log_r_live / sigma) ** 2) * log_r_live.exp() * a)[valid].mean()
    (grad_undetached,) = torch.autograd.grad(undetached, lp)
    assert (grad_undetached - grad).abs().max() > 1e-3


def test_gipo_sigma_changes_the_loss_and_large_sigma_is_plain_pg() -> None:
    lp, old, adv, valid = _leaf_inputs()
    kw = {"logprobs": lp, "old_logprobs": old, "advantages": adv, "valid": valid}
    narrow, _ = gipo_loss(**kw, sigma=0.2)
    wide, _ = gipo_loss(**kw, sigma=1.0)
    huge, _ = gipo_loss(**kw, sigma=1e6)
    assert abs(narrow.item() - wide.item()) > 1e-3
    plain = (-(lp - old).exp() * adv[:, None])[valid].mean()
    torch.testing.assert_close(huge, plain, rtol=1e-9, atol=1e-9)


def test_sapo_gradient_is_gate_4p1mp_times_policy_gradient() -> None:
    lp, old, adv, valid = _leaf_inputs(seed=3)
    tau_pos, tau_neg = 1.0, 1.5
    loss, _ = sapo_loss(
        logprobs=lp, old_logprobs=old, advantages=adv, valid=valid, tau_pos=tau_pos, tau_neg=tau_neg
    )
    (grad,) = torch.autograd.grad(loss, lp)

    r = (lp - old).detach().exp()
    a = adv[:, None].expand(-1, K)
    tau = torch.where(a > 0, tau_pos, tau_neg).double()
    p = torch.sigmoid(tau * (r - 1))
    n_valid_tokens = int(valid.sum()) * K
    # d/dlogp [-(4/τ)·σ(τ(r-1))·A] = -(4/τ)·τ·p(1-p)·r·A = 4p(1-p) · (-r·A)  (plain PG times a gate)
    expected = torch.where(valid[:, None], 4 * p * (1 - p) * (-r * a) / n_valid_tokens, 0.0)
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss, (-(4 / tau) * p * a)[valid].mean(), rtol=1e-10, atol=1e-12)


def test_sapo_float64_uses_exact_temperatures() -> None:
    """τ is built in the inputs' dtype: with float64 inputs, τ_neg = 1.05 exactly.

    A float32 τ (``torch.where`` on Python floats) gives 1.0499999523, a relative error of 4.5e-8
    in the loss, far above the 1e-13 tolerance here.
    """
    lp, old, adv, valid = _leaf_inputs(seed=6)
    adv = adv - adv[valid].mean()  # both signs, so both temperatures are exercised
    loss, _ = sapo_loss(logprobs=lp, old_logprobs=old, advantages=adv, valid=valid, tau_pos=1.0, tau_neg=1.05)
    r = (lp - old).detach().exp()
    a = adv[:, None].expand(-1, K)
    tau = torch.full_like(a, 1.05)
    tau[a > 0] = 1.0  # float64 throughout: the formula's τ, not a float32 rounding of it
    ref = (-(4 / tau) * torch.sigmoid(tau * (r - 1)) * a)[valid].mean()
    assert (adv[valid] < 0).any() and (adv[valid] > 0).any()
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss.detach(), ref, rtol=1e-13, atol=0)


def test_sapo_on_policy_gradient_equals_plain_policy_gradient() -> None:
    _, old, adv, valid = _leaf_inputs(seed=4)
    lp = old.clone().requires_grad_()
    loss, _ = sapo_loss(logprobs=lp, old_logprobs=old, advantages=adv, valid=valid)
    (grad,) = torch.autograd.grad(loss, lp)
    expected = torch.where(valid[:, None], -adv[:, None].expand(-1, K) / (int(valid.sum()) * K), 0.0)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-14)


def test_sapo_tau_neg_only_affects_negative_advantages() -> None:
    lp, old, _, valid = _leaf_inputs(seed=5)
    kw = {"logprobs": lp, "old_logprobs": old, "valid": valid}
    pos = torch.linspace(0.1, 1.0, 8, dtype=torch.float64)
    assert sapo_loss(**kw, advantages=pos, tau_neg=1.05)[0] == sapo_loss(**kw, advantages=pos, tau_neg=3.0)[0]
    neg = -pos
    assert sapo_loss(**kw, advantages=neg, tau_neg=1.05)[0] != sapo_loss(**kw, advantages=neg, tau_neg=3.0)[0]
    assert sapo_loss(**kw, advantages=pos, tau_pos=1.0)[0] != sapo_loss(**kw, advantages=pos, tau_pos=3.0)[0]


@pytest.mark.parametrize(
    ("ratio", "adv", "zero_grad"),
    [
        (1.5, 1.0, True),  # r > 1+ε, A > 0: clipped
        (1.5, -1.0, False),  # r > 1+ε, A < 0: pessimistic unclipped term keeps the gradient
        (0.5, -1.0, True),  # r < 1-ε, A < 0: clipped
        (0.5, 1.0, False),  # r < 1-ε, A > 0: unclipped
        (1.1, 1.0, False),
        (0.9, -1.0, False),
    ],
)
def test_ppo_clip_zeroes_gradient_only_where_it_removes_incentive(
    ratio: float, adv: float, zero_grad: bool
) -> None:
    old = torch.tensor([-1.0], dtype=torch.float64)
    lp = (old + math.log(ratio)).requires_grad_()
    loss, info = ppo_clip_loss(
        logprobs=lp, old_logprobs=old, advantages=torch.tensor([adv], dtype=torch.float64),
        valid=torch.tensor([True]), clip_eps=0.2,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, lp)
    clipped_ratio = min(max(ratio, 0.8), 1.2)
    assert loss.item() == pytest.approx(-min(ratio * adv, clipped_ratio * adv))
    if zero_grad:
        assert grad.item() == 0.0
    else:
        assert grad.item() == pytest.approx(-ratio * adv)
    assert info["clip_frac"].item() == (1.0 if abs(ratio - 1) > 0.2 else 0.0)


def test_ppo_clip_eps_changes_behaviour() -> None:
    lp, old, adv, valid = _leaf_inputs(seed=6)
    kw = {"logprobs": lp, "old_logprobs": old, "advantages": adv, "valid": valid}
    assert ppo_clip_loss(**kw, clip_eps=0.1)[0] != ppo_clip_loss(**kw, clip_eps=0.3)[0]


# ---------------------------------------------------------------------------- granularity
def _outlier_grad(granularity: str, objective=ppo_clip_loss) -> torch.Tensor:
    old = torch.zeros(1, 4, dtype=torch.float64)
    lp = torch.tensor([[math.log(2.0), 0.01, -0.01, 0.02]], dtype=torch.float64, requires_grad=True)
    loss, _ = objective(
        logprobs=lp, old_logprobs=old, advantages=torch.ones(1, dtype=torch.float64),
        valid=torch.tensor([True]), granularity=granularity, tokens_per_action=2,
    )  # fmt: skip
    return torch.autograd.grad(loss, lp)[0][0]


def test_token_level_clips_the_outlier_token_only() -> None:
    grad = _outlier_grad("token")
    assert grad[0] == 0.0
    assert (grad[1:] != 0).all()


def test_chunk_level_outlier_clips_the_whole_chunk() -> None:
    assert torch.equal(_outlier_grad("chunk"), torch.zeros(4, dtype=torch.float64))


def test_action_level_clips_the_outlier_action_dimension() -> None:
    grad = _outlier_grad("action")  # tokens_per_action=2: tokens {0, 1} and {2, 3}
    assert (grad[:2] == 0).all()
    assert (grad[2:] != 0).all()


def test_gipo_keeps_gradient_on_chunk_outlier() -> None:
    # The point of GIPO: a damped but non-zero gradient where PPO clips everything.
    assert (_outlier_grad("chunk", objective=gipo_loss) != 0).all()


def test_log_ratio_values() -> None:
    lp = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    old = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    assert torch.equal(log_ratio(logprobs=lp, old_logprobs=old), torch.tensor([[1.0, 2.0, 2.0, 3.0]]))
    assert torch.equal(
        log_ratio(logprobs=lp, old_logprobs=old, granularity="action", tokens_per_action=2),
        torch.tensor([[1.5, 2.5]]),
    )
    assert torch.equal(log_ratio(logprobs=lp, old_logprobs=old, granularity="chunk"), torch.tensor([8.0]))
    flat = torch.tensor([0.5, -0.5])
    for gran in ("token", "action", "chunk"):
        assert torch.equal(log_ratio(logprobs=flat, old_logprobs=torch.zeros(2), granularity=gran), flat)


def test_info_dict_values_and_detached() -> None:
    lp, old, adv, valid = _leaf_inputs(seed=7)
    for name, fn in OBJECTIVES.items():
        _, info = fn(logprobs=lp, old_logprobs=old, advantages=adv, valid=valid, clip_eps=0.2)
        log_r = (lp - old).detach()[valid]
        r = log_r.exp()
        torch.testing.assert_close(info["approx_kl"], ((r - 1) - log_r).mean())
        torch.testing.assert_close(info["clip_frac"], ((r - 1).abs() > 0.2).double().mean())
        torch.testing.assert_close(info["ratio_mean"], r.mean())
        assert all(v.ndim == 0 and not v.requires_grad for v in info.values()), name
    _, wide = gipo_loss(logprobs=lp, old_logprobs=old, advantages=adv, valid=valid, clip_eps=0.5)
    _, narrow = gipo_loss(logprobs=lp, old_logprobs=old, advantages=adv, valid=valid, clip_eps=0.05)
    assert narrow["clip_frac"] > wide["clip_frac"]


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_count_override_rescales_loss(objective: str) -> None:
    lp, old, adv, valid = _leaf_inputs(seed=8)
    kw = {"logprobs": lp, "old_logprobs": old, "advantages": adv, "valid": valid}
    local, local_info = OBJECTIVES[objective](**kw)
    scaled, scaled_info = OBJECTIVES[objective](**kw, count=3.0)  # 6 valid rows locally, 'global/W' = 3
    torch.testing.assert_close(scaled, 2 * local)
    # Diagnostics use the same denominator, so their rank average is the exact global mean too.
    assert local_info["clip_frac"] > 0
    for key, value in local_info.items():
        torch.testing.assert_close(scaled_info[key], 2 * value)


# ---------------------------------------------------------------------------- errors
def _expect_shapes(exc: pytest.ExceptionInfo, *shapes: tuple[int, ...]) -> None:
    for shape in shapes:
        assert str(shape) in str(exc.value), (shape, str(exc.value))


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_shape_errors_name_both_shapes(objective: str) -> None:
    fn = OBJECTIVES[objective]
    ok = {"logprobs": torch.zeros(4, 3), "old_logprobs": torch.zeros(4, 3), "advantages": torch.zeros(4)}
    valid = torch.ones(4, dtype=torch.bool)
    with pytest.raises(ValueError) as exc:
        fn(**{**ok, "old_logprobs": torch.zeros(4, 2)}, valid=valid)
    _expect_shapes(exc, (4, 3), (4, 2))
    with pytest.raises(ValueError) as exc:
        fn(**{**ok, "advantages": torch.zeros(5)}, valid=valid)
    _expect_shapes(exc, (5,), (4, 3))
    with pytest.raises(ValueError) as exc:
        fn(**ok, valid=torch.ones(3, dtype=torch.bool))
    _expect_shapes(exc, (3,), (4, 3))
    with pytest.raises(ValueError) as exc:  # a token mask cannot be used with chunk ratios
        fn(**ok, valid=torch.ones(4, 3, dtype=torch.bool), granularity="chunk")
    _expect_shapes(exc, (4, 3), (4,))
    with pytest.raises(ValueError, match="bool"):
        fn(**ok, valid=torch.ones(4))


def test_bad_settings_are_named() -> None:
    kw = {"logprobs": torch.zeros(2, 4), "old_logprobs": torch.zeros(2, 4), "advantages": torch.zeros(2)}
    kw["valid"] = torch.ones(2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"token \| action \| chunk.*'sequence'"):
        ppo_clip_loss(**kw, granularity="sequence")
    with pytest.raises(ValueError, match="tokens_per_action"):
        ppo_clip_loss(**kw, granularity="action", tokens_per_action=3)
    for sigma in (0.0, -1.0):
        with pytest.raises(ValueError, match="sigma"):
            gipo_loss(**kw, sigma=sigma)
    with pytest.raises(ValueError, match="tau_pos"):
        sapo_loss(**kw, tau_pos=0.0)
    with pytest.raises(ValueError, match="tau_neg"):
        sapo_loss(**kw, tau_neg=-1.0)
    with pytest.raises(ValueError, match="clip_eps"):
        ppo_clip_loss(**kw, clip_eps=0.0)
    with pytest.raises(ValueError, match=r"\[N\] or \[N, K\]"):
        log_ratio(logprobs=torch.zeros(2, 2, 2), old_logprobs=torch.zeros(2, 2, 2))
