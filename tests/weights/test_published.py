"""What a weight sync publishes (``sync_entries``, the one rule every path uses): trainable parameters
and floating buffers, never a frozen parameter, which travels once with the policy copy at start.

Each path is checked on a module whose frozen weights the trainer changed after the copy was made:
were they published, the copy would see the change. Then a LoRA VLAPolicy through the samplers'
shared memory in a spawned process holds exactly the trainer's weights, for a fraction of the bytes.
"""

from __future__ import annotations

import copy
import io
import time

import torch
import torch.multiprocessing as mp
from torch import nn

from fastlight.data.cpu_copy import cpu_copy
from fastlight.vla.policy import VLAPolicy
from fastlight.weights.broadcast import SyncGroupConfig, WeightBroadcaster, WeightReceiver
from fastlight.weights.buckets import plan_buckets, sync_entries
from fastlight.weights.double_buffer import SharedDoubleBuffer
from fastlight.weights.publisher import WeightSyncError
from fastlight.weights.shared_memory import SharedWeights

CTX = mp.get_context("spawn")
PUBLISHED = ["head.bias", "head.weight", "mean"]  # sorted parameters, then floating buffers
FLOATS = 2 * 8 + 2 + 8  # head.weight, head.bias, mean


class FrozenBase(nn.Module):
    """A frozen base layer, a trainable head, a floating running statistic and an integer counter."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.base = nn.Linear(8, 8).requires_grad_(False)
        self.head = nn.Linear(8, 2)
        self.register_buffer("mean", torch.randn(8))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def train_step(self) -> None:
        """What a trainer changes (head, statistic), and the frozen base changed behind its back."""
        with torch.no_grad():
            self.head.weight.add_(1.0)
            self.mean.mul_(2.0)
            self.base.weight.add_(100.0)


def assert_published_only(trainer: FrozenBase, copy_: FrozenBase, base_at_start: torch.Tensor) -> None:
    assert torch.equal(copy_.head.weight, trainer.head.weight) and torch.equal(copy_.mean, trainer.mean)
    assert torch.equal(copy_.base.weight, base_at_start)  # not published: the copy's own, from the start
    assert not torch.equal(copy_.base.weight, trainer.base.weight)


def test_the_rule_is_trainable_parameters_then_floating_buffers():
    assert [k for k, _ in sync_entries(FrozenBase(0))] == PUBLISHED
    assert [s.name for s in plan_buckets(FrozenBase(0)).slots] == PUBLISHED  # broadcast, double buffer
    p = VLAPolicy(vocab_size=64, n_bins=16, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                  lora={"r": 2, "alpha": 4, "target_modules": ["q_proj"]})  # fmt: skip
    names = {k for k, _ in sync_entries(p)}
    trainable = {n for n, t in p.named_parameters() if t.requires_grad}
    floating = {n for n, b in p.named_buffers() if b.is_floating_point()}
    assert names == trainable | floating and "backbone.lm_head.weight" in names
    assert not any("base_layer" in n or "embed_tokens" in n for n in names)


def test_shared_memory_publishes_the_trainable_weights_and_buffers_only():
    trainer = FrozenBase(0)
    sampler = copy.deepcopy(trainer)  # the samplers' copy, made when they start
    base_at_start = sampler.base.weight.clone()
    shared = SharedWeights(trainer, CTX)
    trainer.train_step()
    stats = shared.publish(trainer, version=3)
    assert stats.bytes == 4 * FLOATS  # float32 tensors: what sync/bytes shows
    assert shared.load_into(sampler) == 3
    assert_published_only(trainer, sampler, base_at_start)
    trainer.base.requires_grad_(True)  # the published set changed: refused, not silently misaligned
    try:
        shared.publish(trainer, version=4)
        raise AssertionError("publish accepted a changed set of tensors")
    except WeightSyncError as e:
        assert "now also ['base.bias', 'base.weight']" in str(e), e


def test_the_inference_workers_double_buffer_swaps_in_the_published_tensors_only():
    trainer, worker = FrozenBase(0), FrozenBase(1)
    base_at_start = worker.base.weight.clone()
    shared = SharedDoubleBuffer(trainer, CTX, timeout_s=5)
    assert shared.nbytes == 4 * FLOATS and [s.name for s in shared.layout.slots] == PUBLISHED
    reader = shared.attach(worker, name="test worker")
    trainer.train_step()
    shared.publish(trainer, 0, wait=False)
    assert reader.receive() == 0
    assert_published_only(trainer, worker, base_at_start)


def _receiver(cfg: SyncGroupConfig, q) -> None:
    try:
        worker = FrozenBase(1)
        rx = WeightReceiver(worker, cfg, bucket_mb=0.001, name="test-worker")
        version = rx.receive()
        buf = io.BytesIO()
        torch.save(worker.state_dict(), buf)
        q.put((version, buf.getvalue()))
        rx.close()
    except BaseException as exc:  # noqa: BLE001 -- report anything to the test
        q.put(("error", repr(exc)))


def test_the_broadcast_sends_the_published_tensors_only():
    cfg = SyncGroupConfig.local(timeout_s=30, join_timeout_s=120)
    q = CTX.Queue()
    proc = CTX.Process(target=_receiver, args=(cfg, q), daemon=True)
    proc.start()
    try:
        trainer = FrozenBase(0)
        trainer.train_step()
        with WeightBroadcaster(trainer, cfg, bucket_mb=0.001) as bc:
            assert bc.broadcast(7).bytes == 4 * FLOATS
            version, blob = q.get(timeout=60)
        assert version == 7, blob
        worker = FrozenBase(1)
        worker.load_state_dict(torch.load(io.BytesIO(blob), weights_only=True))
        assert_published_only(trainer, worker, FrozenBase(1).base.weight)
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()


def _sampler(policy: nn.Module, shared: SharedWeights, q) -> None:
    try:
        deadline = time.monotonic() + 60
        while shared.version < 0:
            assert time.monotonic() < deadline, "nothing published"
            time.sleep(0.01)
        version = shared.load_into(policy)
        buf = io.BytesIO()
        torch.save(policy.state_dict(), buf)  # bytes: shared tensors would die with this process
        q.put((version, buf.getvalue()))
    except BaseException as exc:  # noqa: BLE001 -- report anything to the test
        q.put(("error", repr(exc)))


def test_a_lora_policys_sampler_gets_the_trainers_weights_for_a_fraction_of_the_bytes():
    torch.manual_seed(0)
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    sizes = {"vocab_size": 300, "n_bins": 32, "hidden_size": 64, "num_hidden_layers": 4}
    small = {"image_size": 32, "patch_size": 8, "value_mlp_hidden": 16, "max_episode_steps": 16}
    policy = VLAPolicy(**sizes, **small, proprio_dim=4, lora=lora)
    start = cpu_copy(policy).eval()  # what the pool sends the samplers when they start
    shared = SharedWeights(start, CTX)
    q = CTX.Queue()
    proc = CTX.Process(target=_sampler, args=(start, shared, q), daemon=True)
    proc.start()
    try:
        with torch.no_grad():  # an update: every trainable tensor moves, the base weights do not
            for t in policy.parameters():
                if t.requires_grad:
                    t.add_(0.01 * torch.randn_like(t))
        stats = shared.publish(policy, version=1)
        version, blob = q.get(timeout=120)
        assert version == 1, blob
        got = torch.load(io.BytesIO(blob), weights_only=True)
        want = policy.state_dict()
        assert list(got) == list(want)
        for k, v in want.items():
            assert torch.equal(got[k], v), k
        published = sum(t.numel() for _, t in sync_entries(policy))
        every = sum(v.numel() for v in want.values() if v.is_floating_point())
        assert stats.bytes == 4 * published and published < 0.2 * every, (published, every)
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
