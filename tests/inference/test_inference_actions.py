"""The inference worker applies the policy's own action mapping: same env actions as local samplers.

Regression: the worker path once looked the mapping up under a name no policy defined, so a
VLA's bins (0..n_bins-1) reached ``env.step`` unmapped and a Gaussian policy's clamp was skipped.
Here the same seeds and weights run through in-process samplers and through the inference
worker, and an env that echoes what it received shows the env actions of both.
"""

from __future__ import annotations

import pytest
import torch

from fastlight.envs.registry import make_env
from fastlight.fleet.base import FleetBuild
from fastlight.fleet.pool import SamplerPool
from fastlight.inference.settings import InferenceSettings
from fastlight.models.action_mapping import BinsToActions, ClampActions
from fastlight.sampling.bundle import SamplerConfig
from fastlight.sampling.obs import obs_to_tensor, stack_obs
from tests.lightning_helpers import wait_no_children
from tests.policies import GreedyMLP, GreedyVLA

pytestmark = pytest.mark.multiproc
ECHO = "tests.fake_envs:ActionEcho-v0"
A = 3  # action dimensions
INFERENCE = InferenceSettings(max_batch=64, max_wait_ms=1.0, sync_bucket_mb=1.0, sync_timeout_s=30.0)


def mlp() -> GreedyMLP:
    torch.manual_seed(0)
    policy = GreedyMLP(4 + A, A, continuous=True, action_bound=1.0)
    with torch.no_grad():  # push the greedy means well outside [-1, 1], so the clamp matters
        policy.actor[-1].weight.mul_(400.0)
    return policy


def vla() -> GreedyVLA:
    torch.manual_seed(0)
    return GreedyVLA(
        action_dim=A, n_bins=16, proprio_dim=4 + A, max_text_len=5, vocab_size=64, hidden_size=32,
        num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, value_mlp_hidden=16,
        max_episode_steps=8,
    )  # fmt: skip


def run(policy, kind: str, inference: bool):
    """One rollout of 4 envs in one sampler; returns (policy actions [T, E, A], env actions [T, E, A])."""
    env_kwargs = {"kind": kind, "action_dim": A, "length": 5}
    cfg = SamplerConfig(
        env_id=ECHO, num_envs=4, env_kwargs=env_kwargs, reset_mode="autoreset", rollout_steps=8, seed=7
    )
    probe = make_env(ECHO, env_kwargs=env_kwargs)
    example = obs_to_tensor(stack_obs([probe.reset(seed=0)[0]]))
    pool = SamplerPool(
        FleetBuild([cfg], policy, inference=INFERENCE if inference else None, example_obs=example)
    )
    try:
        pool.start()
        pool.publish(policy, 0)
        rollout = None
        while rollout is None:
            rollout = pool.next_item(timeout=1.0)
    finally:
        pool.stop()
    obs = rollout.obs["proprio"] if kind == "vla" else rollout.obs
    env_actions = obs[..., 4:]  # the echo of step t is in the observation of step t + 1
    # Autoreset: after a terminal step the next observation is a fresh reset, not an echo.
    follows = rollout.valid[1:] & rollout.valid[:-1] & ~rollout.terminated[:-1] & ~rollout.truncated[:-1]
    return rollout.actions[:-1][follows], env_actions[1:][follows]


@pytest.mark.parametrize("kind", ["vector", "vla"])
def test_inference_worker_and_local_samplers_give_identical_env_actions(kind):
    build, mapping = (mlp, ClampActions(1.0)) if kind == "vector" else (vla, None)
    local_actions, local_env = run(build(), kind, inference=False)
    remote_actions, remote_env = run(build(), kind, inference=True)
    wait_no_children()
    assert local_env.shape[0] >= 16  # enough echoed steps to mean something
    mapping = mapping or BinsToActions(build().action_tokenizer)
    # Each path's env got exactly the policy's mapping of its actions ...
    torch.testing.assert_close(local_env, mapping(local_actions).float(), rtol=0, atol=0)
    torch.testing.assert_close(remote_env, mapping(remote_actions).float(), rtol=0, atol=0)
    # ... and the two paths agree. Same greedy forward on the same rows; the worker batches the
    # one sampler's rows as they are. 1e-5 absorbs a different CPU kernel choice; an unmapped
    # action is off by >= 1 (a clamp skipped at |mean| up to ~3, or a bin index instead of its centre).
    torch.testing.assert_close(remote_env, local_env, rtol=0, atol=1e-5)
    if kind == "vector":
        assert local_env.abs().max() == 1.0 and (local_actions.abs() > 1.5).any()  # the clamp was needed
    else:
        assert torch.equal(remote_actions, local_actions)  # same bins
        assert local_env.abs().max() < 1.0 and local_actions.max() > 1  # centres, not bin indices


def test_a_policy_without_an_action_mapping_is_refused_before_any_process_starts():
    class NoMapping(torch.nn.Module):
        def act(self, obs, *, step=None, deterministic=False): ...

        def evaluate(self, obs, actions, *, step=None): ...

        def value(self, obs, *, step=None): ...

    cfg = SamplerConfig(env_id=ECHO, num_envs=1)
    with pytest.raises(
        TypeError, match="NoMapping does not implement .*Policy: missing action_mapping, env_action"
    ):
        SamplerPool(FleetBuild([cfg], NoMapping()))
