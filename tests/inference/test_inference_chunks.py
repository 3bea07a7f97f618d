"""Action chunks through the inference worker: the worker returns the chunk's bins, the sampler applies
the policy's chunked mapping and executes it open-loop, as a sampler with a local policy copy does."""

from __future__ import annotations

import pytest
import torch

from fastlight.envs.registry import make_env
from fastlight.fleet.base import FleetBuild
from fastlight.fleet.pool import SamplerPool
from fastlight.inference.settings import InferenceSettings
from fastlight.sampling.bundle import SamplerConfig
from fastlight.sampling.obs import obs_to_tensor, stack_obs
from tests.lightning_helpers import wait_no_children
from tests.policies import GreedyVLA

pytestmark = pytest.mark.multiproc
ECHO = "tests.fake_envs:ActionEcho-v0"
A, CHUNK = 3, 2
INFERENCE = InferenceSettings(max_batch=64, max_wait_ms=1.0, sync_bucket_mb=1.0, sync_timeout_s=30.0)


def vla() -> GreedyVLA:
    torch.manual_seed(0)
    return GreedyVLA(
        action_dim=A, n_bins=16, proprio_dim=4 + A, max_text_len=5, vocab_size=64, hidden_size=32,
        num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, value_mlp_hidden=16,
        max_episode_steps=8, action_chunk=CHUNK,
    )  # fmt: skip


def rollout(inference: bool):
    env_kwargs = {"kind": "vla", "action_dim": A, "length": 5}
    cfg = SamplerConfig(
        env_id=ECHO, num_envs=3, env_kwargs=env_kwargs, reset_mode="autoreset", rollout_steps=10, seed=7
    )
    probe = make_env(ECHO, env_kwargs=env_kwargs)
    example = obs_to_tensor(stack_obs([probe.reset(seed=0)[0]]))
    policy = vla()
    pool = SamplerPool(
        FleetBuild([cfg], policy, inference=INFERENCE if inference else None, example_obs=example)
    )
    try:
        pool.start()
        pool.publish(policy, 0)
        r = None
        while r is None:
            r = pool.next_item(timeout=1.0)
    finally:
        pool.stop()
    return r


def test_chunks_served_by_the_inference_worker_run_as_local_ones():
    local, remote = rollout(inference=False), rollout(inference=True)
    wait_no_children()
    assert remote.chunked and remote.actions.shape == (5, 3, CHUNK * A)  # 10 env steps in chunks of 2
    assert (
        remote.env_steps.tolist() == local.env_steps.tolist() == [[2] * 3, [2] * 3, [1] * 3, [2] * 3, [2] * 3]
    )
    assert torch.equal(remote.actions, local.actions)  # same greedy bins
    assert torch.equal(remote.valid, local.valid) and torch.equal(remote.terminated, local.terminated)
    # The env got the decoded last step of each chunk (the echo in the next observation), on both paths.
    decoded = vla().bins_to_env_action(remote.actions)  # [T, E, CHUNK, A]
    follows = ~remote.terminated[:-1]
    last = (remote.env_steps[:-1] - 1).clamp(min=0)
    expected = decoded[:-1].gather(2, last[..., None, None].expand(-1, -1, 1, A)).squeeze(2)
    torch.testing.assert_close(
        remote.obs["proprio"][1:, :, 4:][follows], expected[follows], rtol=0, atol=1e-5
    )
    torch.testing.assert_close(remote.obs["proprio"], local.obs["proprio"], rtol=0, atol=1e-5)
    # Env steps: each env ran 2 + 2 + 1 (its episode ended) + 2 + 2; each slot spans 2 env steps.
    assert remote.stats.valid_steps == local.stats.valid_steps == 3 * 9
    assert remote.stats.raw_steps == local.stats.raw_steps == 3 * 10
