"""Inference worker: drain keeps forwards on whole models, on-policy data, failures, no orphans."""

from __future__ import annotations

import os
import signal
import time

import pytest

from benchmarks.checksums import weights_checksum
from fastlight.callbacks.weight_sync import WeightSync
from fastlight.data.datamodule import RolloutDataModule
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.pool import SamplerError
from fastlight.inference import client as client_module
from fastlight.inference.settings import InferenceSettings
from fastlight.modules.rl_module import RLModule
from tests.lightning_helpers import quiet_trainer, wait_no_children
from tests.policies import AuditedMLP

pytestmark = pytest.mark.multiproc
FIXED = "tests.fake_envs:FixedLength-v0"


class Audited(RLModule):
    """Records the checksum of every published version and the behaviour versions it trains on;
    with ``audit_path`` set, its policy records the checksum behind every forward (``AuditedMLP``)."""

    audit_path: str | None = None

    def build_policy(self):
        if self.audit_path is None:
            return super().build_policy()
        h = self.hparams
        sizes = tuple(h.hidden_sizes)
        return AuditedMLP(h.obs_dim, h.action_dim, hidden_sizes=sizes, audit_path=self.audit_path)

    def on_train_start(self):
        self.published = {}
        self.seen = []
        self.pids = [p.pid for p in self.trainer.datamodule.pool.procs]
        self.pids.append(self.trainer.datamodule.pool.client.proc.pid)
        client = self.trainer.datamodule.pool.client
        self.sync_setup = (client.transport, str(client.trainer_device), str(client.worker_device))

    def training_step(self, batch, batch_idx):
        self.sync_modes = getattr(self, "sync_modes", set()) | {self.trainer.datamodule.last_sync.mode}
        self.published[self.policy_version] = weights_checksum(self.policy)
        self.seen.append((self.policy_version, batch.policy_version[batch.valid].unique().tolist()))
        out = super().training_step(batch, batch_idx)
        self.published[self.policy_version] = weights_checksum(self.policy)  # what WeightSync sends next
        return out


@pytest.mark.parametrize("transport", ["shared_memory", "broadcast"])
@pytest.mark.parametrize("drain", [True, False])
def test_every_forward_uses_a_whole_published_model(drain, transport, tmp_path, monkeypatch):
    """A CPU worker takes shared memory by default; ``broadcast`` forces the gloo group (as for a
    CUDA worker) through the same run, so both weight paths keep this guarantee."""
    if transport == "broadcast":
        monkeypatch.setattr(client_module, "weight_path", lambda trainer, worker: "bucketed")
    audit = tmp_path / "forwards.txt"
    dm = RolloutDataModule(
        env_id=FIXED,
        env_kwargs={"lengths": (3, 5)},
        num_envs=4,
        num_workers=2,
        inference=InferenceSettings(max_wait_ms=1.0),
    )
    model = Audited(obs_dim=3, action_dim=2, update_epochs=2, num_minibatches=2)
    model.audit_path = str(audit)  # read by build_policy in configure_model; the worker's copy writes here
    sync = WeightSync(drain=drain)
    quiet_trainer(max_steps=4 * 6, callbacks=[sync]).fit(model, datamodule=dm)
    assert sync.drains == (6 if drain else 0)
    assert model.sync_setup == (transport, "cpu", "cpu")  # CPU worker: shared memory unless forced
    assert model.sync_modes == {"shared_memory" if transport == "shared_memory" else "bucketed"}
    forwards = [float(line) for line in audit.read_text().splitlines()]
    assert len(forwards) > 20
    served = set()
    for checksum in forwards:
        # The weights each forward used are exactly one published version's: no forward ever ran
        # on a half-updated model. The worker's float64 sum may run on another thread count than
        # the trainer's: relative 1e-12; one optimizer step moves it by far more (lr 2.5e-4).
        match = [v for v, c in model.published.items() if checksum == pytest.approx(c, rel=1e-12)]
        assert len(match) == 1, (checksum, model.published)
        served.add(match[0])
    assert set(range(6)) <= served <= set(range(7))
    # Strictly on-policy through the inference worker too.
    assert model.seen == [(v, [v]) for v in range(6)]
    wait_no_children()


def test_killing_the_inference_worker_stops_fit_with_a_clear_error():
    class Killer(Audited):
        def training_step(self, batch, batch_idx):
            if self.policy_version == 2:
                os.kill(self.pids[-1], signal.SIGKILL)
            return super().training_step(batch, batch_idx)

    # Budget 0: the worker is not restarted (restarts: tests/faults/test_inference_restarts.py).
    dm = RolloutDataModule(
        env_id=FIXED, num_envs=2, num_workers=2, inference=InferenceSettings(sync_timeout_s=10),
        faults=FaultSettings(max_worker_restarts=0),
    )
    model = Killer(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=1)
    t0 = time.monotonic()
    named = r"inference worker \(fastlight-inference, pid \d+, env .*\) died with exit code -9.*; restart b"
    with pytest.raises(SamplerError, match=named):
        quiet_trainer(max_steps=50, callbacks=[WeightSync()]).fit(model, datamodule=dm)
    assert time.monotonic() - t0 < 60
    wait_no_children()
    for pid in model.pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
