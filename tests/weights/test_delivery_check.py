"""Weight delivery is verified (issue 40 item 3): ``delivery_checksum`` sees a stale or partly copied
copy, ``DeliveryCheck`` compares what receivers report with what the trainer published, and in real
runs a transport that keeps sending version 0's weights under rising version numbers is stopped within
``--data.faults.verify_weights_every`` syncs, in one line naming the receiver, version and transport,
through the samplers' shared memory and through the inference worker; a sound run logs ``sync/verified``.
"""

from __future__ import annotations

import copy
import math
import re

import lightning as L
import pytest
import torch
from torch import nn

from fastlight.callbacks.weight_sync import WeightSync
from fastlight.data.cpu_copy import cpu_copy
from fastlight.data.datamodule import RolloutDataModule
from fastlight.fleet.faults import FaultSettings
from fastlight.inference import client as client_module
from fastlight.inference.settings import InferenceSettings
from fastlight.modules.rl_module import RLModule
from fastlight.weights.broadcast import WeightBroadcaster
from fastlight.weights.buckets import PackedWeights, layout_tensors, plan_buckets, sync_entries
from fastlight.weights.checksum import REL_TOL, Checksum, DeliveryCheck, delivery_checksum
from fastlight.weights.double_buffer import SharedDoubleBuffer
from fastlight.weights.publisher import WeightSyncError
from fastlight.weights.shared_memory import SharedWeights
from tests.lightning_helpers import quiet_trainer, wait_no_children

FIXED = "tests.fake_envs:FixedLength-v0"


class Net(nn.Module):
    """Two dtypes (two buckets), a tensor larger than the sample, a frozen layer, a floating buffer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.big = nn.Linear(1000, 300)  # 300k weights: a strided sample of them
        self.bf16 = nn.Linear(8, 8).to(torch.bfloat16)
        self.frozen = nn.Linear(8, 8).requires_grad_(False)
        self.register_buffer("mean", torch.randn(8))


def step(module: nn.Module, relative: float = 1e-4) -> None:
    """What an optimizer step does to every published tensor: each element moves a little."""
    with torch.no_grad():
        for _, t in sync_entries(module):
            t.mul_(1 + relative * torch.randn_like(t).sign())


def test_identical_copies_agree_and_an_update_of_any_one_tensor_is_seen():
    trainer = Net()
    want = delivery_checksum(trainer)
    assert want.scale > 0 and want.matches(delivery_checksum(copy.deepcopy(trainer)).value)
    assert want.matches(delivery_checksum(cpu_copy(trainer)).value)  # the samplers' copy at spawn
    for name, _ in sync_entries(trainer):
        changed = copy.deepcopy(trainer)
        t = dict(sync_entries(changed))[name]
        with torch.no_grad():
            t.mul_(1 + 1e-2 * torch.randn_like(t).sign())  # bfloat16 has 8 bits: 1e-2 is a few ulps
        assert not want.matches(delivery_checksum(changed).value), name
    updated = copy.deepcopy(trainer)
    with torch.no_grad():  # a small step, 1e-6 relative (~8 float32 ulps), of the float32 tensors only
        for _, t in sync_entries(updated):
            if t.dtype == torch.float32:
                t.mul_(1 + 1e-6 * torch.randn_like(t).sign())
    assert not want.matches(delivery_checksum(updated).value)


def test_frozen_weights_are_not_covered_and_swapped_tensors_are():
    trainer = Net()
    want = delivery_checksum(trainer)
    frozen = copy.deepcopy(trainer)
    with torch.no_grad():
        frozen.frozen.weight.add_(1.0)  # never published (it travels once, with the copy at spawn)
    assert delivery_checksum(frozen) == want
    swapped = copy.deepcopy(trainer)
    with torch.no_grad():  # the same numbers in the wrong places
        swapped.bf16.weight.copy_(swapped.bf16.weight.t().clone())
    assert not want.matches(delivery_checksum(swapped).value)


def test_a_dropped_bucket_is_seen_and_the_whole_delivery_matches():
    trainer = Net()
    receiver = copy.deepcopy(trainer)  # holds version 0
    step(trainer, 1e-2)  # version 1
    packed = PackedWeights.alloc(plan_buckets(trainer))
    assert len(packed.layout.buckets) == 2  # float32, bfloat16
    packed.pack(layout_tensors(trainer, packed.layout))
    want = delivery_checksum(trainer)
    for bucket in range(2):
        partial = copy.deepcopy(receiver)
        packed.unpack(layout_tensors(partial, packed.layout), bucket=bucket)  # the other one dropped
        assert not want.matches(delivery_checksum(partial).value), bucket
    packed.unpack(layout_tensors(receiver, packed.layout))
    assert delivery_checksum(receiver) == want  # same numbers, same kernels: bitwise


def test_tensors_held_as_views_of_a_slot_or_transposed_read_the_same_elements():
    trainer = Net()
    want = delivery_checksum(trainer)
    swapped = copy.deepcopy(trainer)  # as the inference worker after its pointer swap: views at offsets
    packed = PackedWeights.alloc(plan_buckets(trainer))
    packed.pack(layout_tensors(trainer, packed.layout))
    for t, view in zip(layout_tensors(swapped, packed.layout), packed.views, strict=True):
        t.data = view
    assert delivery_checksum(swapped) == want
    strided = copy.deepcopy(trainer)
    strided.big.weight.data = strided.big.weight.data.t().contiguous().t()  # same values, not contiguous
    assert not strided.big.weight.is_contiguous() and delivery_checksum(strided) == want


def test_the_tolerance_is_relative_to_the_scale():
    want = Checksum(value=1.0, scale=1e6)  # a sum of large terms that cancel
    assert want.matches(1.0 + 0.5 * REL_TOL * 1e6) and not want.matches(1.0 + 2 * REL_TOL * 1e6)
    assert Checksum(math.nan, math.nan).matches(math.nan)  # NaN weights at both ends did arrive
    assert not Checksum(1.0, 1.0).matches(math.nan) and not Checksum(0.0, 0.0).matches(1e-300)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_trainer_and_a_cpu_copy_agree():
    trainer = Net()
    step(trainer, 1e-3)
    on_gpu = copy.deepcopy(trainer).cuda()
    want = delivery_checksum(on_gpu)
    assert want.matches(delivery_checksum(trainer).value)
    stale = Net()  # version 0
    assert not want.matches(delivery_checksum(stale).value)


def test_the_check_counts_matches_and_names_a_mismatch_in_one_line():
    policy = Net()
    check = DeliveryCheck(3, keep=4, setting="--data.faults.verify_weights_every")
    versions: dict[int, float] = {}
    for version in range(7):
        check.published(policy, version, "shared_memory")
        versions[version] = delivery_checksum(policy).value
        step(policy, 1e-3)
    assert sorted(check.expected) == [3, 6]  # every 3rd version (0 pruned: 6 - 4 > 0)
    check.check([("sampler 0", 6, versions[6]), ("sampler 1", 6, versions[6]), ("sampler 0", 6, versions[6])])
    check.check([("sampler 0", 5, 123.0)])  # version 5 is not checked: any report passes
    assert check.verified == 2  # once per receiver and version
    with pytest.raises(WeightSyncError) as e:
        check.check([("sampler 1", 3, versions[0])])  # version 0's weights under number 3
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith(
        f"weights did not arrive: sampler 1 holds version 3 with checksum {versions[0]!r}, the trainer "
        f"published {versions[3]!r} (transport shared_memory); "
    )
    setting = "--data.faults.verify_weights_every 3"
    assert line.endswith(f"({setting}: the versions divisible by 3 are checked; 0 turns the check off)")


def test_an_unchanged_policy_is_no_error_and_zero_turns_the_check_off():
    frozen = Net()  # e.g. a value warm-up: the policy does not move between versions
    check = DeliveryCheck(1, keep=1)
    same = delivery_checksum(frozen).value
    for version in range(3):
        check.published(frozen, version, "bucketed")
        check.check([("the inference worker", version, same)])
    assert check.verified == 3
    off = DeliveryCheck(0, keep=1)
    off.published(frozen, 0, "bucketed")
    off.check([("sampler 0", 0, -1.0)])
    assert off.expected == {} and off.verified == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_verify_setting_is_one_line(bad):
    with pytest.raises(ValueError) as e:
        FaultSettings(verify_weights_every=bad)
    assert str(e.value) == f"--data.faults.verify_weights_every must be an integer >= 0 (0: off), got {bad!r}"


# ---------------------------------------------------------------------------------------- real runs
#: (weight path, the transport its publishes name): the samplers' own copies through shared memory, and
#: the inference worker through its double buffer or (forced, as for a CUDA worker) the broadcast group.
PATHS = [
    ("sampler_copies", "shared_memory"),
    ("inference_worker", "shared_memory"),
    ("inference_broadcast", "bucketed"),
]


def keep_sending_version_0(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """The fault of issue 40: the transport publishes the weights of its first publish again and again,
    under the rising version numbers (``sync/bytes``, ``sync/version`` and the policy lag look normal)."""
    first: dict[int, nn.Module] = {}

    def frozen(sender: object, module: nn.Module) -> nn.Module:
        return first.setdefault(id(sender), copy.deepcopy(module))

    if path == "inference_broadcast":
        broadcast = WeightBroadcaster.broadcast

        def stale_broadcast(self, version, module, **kw):
            return broadcast(self, version, frozen(self, module), **kw)

        monkeypatch.setattr(WeightBroadcaster, "broadcast", stale_broadcast)
        return
    cls = SharedWeights if path == "sampler_copies" else SharedDoubleBuffer
    publish = cls.publish

    def stale_publish(self, module, version, **kw):
        return publish(self, frozen(self, module), version, **kw)

    monkeypatch.setattr(cls, "publish", stale_publish)


def fit(
    path: str, every: int, max_steps: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[RolloutDataModule, RLModule, list]:
    logged: list[float] = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            verified = trainer.callback_metrics.get("sync/verified")  # not logged with the check off
            logged.append(math.nan if verified is None else float(verified))

    if path == "inference_broadcast":
        monkeypatch.setattr(client_module, "weight_path", lambda trainer, worker: "bucketed")
    dm = RolloutDataModule(
        env_id=FIXED, num_envs=2, num_workers=2, faults=FaultSettings(verify_weights_every=every),
        inference=None if path == "sampler_copies" else InferenceSettings(max_wait_ms=1.0),
    )  # fmt: skip
    model = RLModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=1, lr=1e-2)
    try:
        quiet_trainer(max_steps=max_steps, callbacks=[WeightSync(), Record()]).fit(model, datamodule=dm)
    finally:
        wait_no_children()
    return dm, model, logged


@pytest.mark.multiproc
@pytest.mark.parametrize(("path", "mode"), PATHS, ids=[p for p, _ in PATHS])
def test_a_transport_that_keeps_sending_old_weights_stops_the_run_within_n_syncs(path, mode, monkeypatch):
    keep_sending_version_0(monkeypatch, path)
    with pytest.raises(WeightSyncError) as e:
        fit(path, every=2, max_steps=20, monkeypatch=monkeypatch)
    line = str(e.value)
    receiver = "sampler [01]" if path == "sampler_copies" else "the inference worker"
    # Version 0's weights are version 0's: checked, fine. Version 1 is not checked; version 2 is caught.
    assert "\n" not in line
    pattern = (
        rf"weights did not arrive: {receiver} holds version 2 with checksum \S+, the trainer published "
        rf"\S+ \(transport {mode}\); the weight path delivered other weights"
    )
    assert re.match(pattern, line), line


@pytest.mark.multiproc
@pytest.mark.parametrize(("path", "mode"), PATHS, ids=[p for p, _ in PATHS])
def test_a_sound_run_logs_the_receivers_it_verified(path, mode, monkeypatch):
    dm, model, logged = fit(path, every=1, max_steps=3, monkeypatch=monkeypatch)
    assert model.policy_version == 3 and dm.last_sync.mode == mode
    # Every version checked: each batch adds its receivers (2 sampler copies, or the one worker).
    per_version = 2 if path == "sampler_copies" else 1
    assert logged == [per_version * (k + 1) for k in range(3)]
    assert dm.delivery.verified == 3 * per_version


@pytest.mark.multiproc
def test_a_transport_that_skips_some_versions_is_caught_at_the_first_with_the_defaults(monkeypatch):
    """Intermittent non-delivery (issue 49): every odd version, the samplers' copies get the previous
    version's weights again. With the default (every version checked) the run stops at version 1."""
    assert FaultSettings().verify_weights_every == 1
    publish, previous = SharedWeights.publish, {}

    def skip_odd(self, module, version, **kw):
        sent = previous.get(id(self), module) if version % 2 else module
        previous[id(self)] = copy.deepcopy(module)
        return publish(self, sent, version, **kw)

    monkeypatch.setattr(SharedWeights, "publish", skip_odd)
    dm = RolloutDataModule(env_id=FIXED, num_envs=2, num_workers=2)  # default FaultSettings
    model = RLModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=1, lr=1e-2)
    with pytest.raises(WeightSyncError, match=r"sampler [01] holds version 1 with checksum"):
        try:
            quiet_trainer(max_steps=20, callbacks=[WeightSync()]).fit(model, datamodule=dm)
        finally:
            wait_no_children()
    assert model.policy_version <= 3  # caught within a version or two of rollouts, not 14 updates later
