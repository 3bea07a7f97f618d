"""RolloutDataModule with real spawned sampler processes: on-policy data, errors, no orphans."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from benchmarks.procfs import descendants
from fastlight.data.datamodule import RolloutDataModule
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.pool import SamplerError
from fastlight.modules.rl_module import RLModule
from fastlight.procs import alive, parent_pid
from tests.lightning_helpers import quiet_trainer, wait_no_children

pytestmark = pytest.mark.multiproc
FIXED = "tests.fake_envs:FixedLength-v0"


class RecordingModule(RLModule):
    """Records the behaviour version of every trained transition and the sampler pids."""

    def on_train_start(self) -> None:
        self.pids = [p.pid for p in self.trainer.datamodule.pool.procs]
        self.seen: list[tuple[int, list[int]]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.policy_version, batch.policy_version[batch.valid].unique().tolist()))
        return super().training_step(batch, batch_idx)


def _default_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _ignored_signals(pid: int) -> list[str]:
    """The signals process ``pid`` ignores (``SigIgn`` in ``/proc/<pid>/status``)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    return [s.name for s in signal.Signals if s < 32 and mask & (1 << (s - 1))]


def assert_no_children(pids: list[int] | None = None) -> None:
    wait_no_children()
    for pid in pids or []:
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]


def test_fit_is_strictly_on_policy_and_leaves_no_children():
    dm = RolloutDataModule(
        env_id=FIXED,
        env_kwargs={"lengths": (3, 6, 2)},
        num_envs=4,
        num_workers=2,
        termination_threshold=0.5,
        cycles_per_step=2,
    )
    model = RecordingModule(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=2)
    # Lightning counts optimizer steps: 4 rollouts x 1 epoch x 2 minibatches.
    quiet_trainer(max_steps=8).fit(model, datamodule=dm)
    assert model.policy_version == 4 and model.global_step == 8
    # Every transition trained at version v was sampled with version v (max_staleness = 0).
    assert model.seen == [(v, [v]) for v in range(4)]
    assert len(model.pids) == 2
    assert_no_children(model.pids)


def test_an_env_exception_is_restarted_then_stops_fit_naming_env_and_budget():
    dm = RolloutDataModule(
        env_id="tests.fake_envs:Crashing-v0",
        num_envs=2,
        num_workers=2,
        faults=FaultSettings(max_worker_restarts=1),
    )
    t0 = time.monotonic()
    with pytest.raises(
        SamplerError, match=r"sampler \d \(fastlight-sampler-\d, pid \d+, env [^)]*\) crashed"
    ) as e:
        quiet_trainer(max_steps=3).fit(RLModule(obs_dim=3, action_dim=2), datamodule=dm)
    assert re.search(
        r"crashed: EnvError: env Crashing-v0 \(index \d of this sampler, seed \d+\) raised RuntimeError at "
        r"episode step \d+: simulator exploded on purpose; restart budget exhausted: 1 restarts",
        str(e.value),
    ), str(e.value)
    assert time.monotonic() - t0 < 60
    assert_no_children()


def test_sampler_hard_crash_is_restarted_then_reported_with_exit_code():
    dm = RolloutDataModule(
        env_id="tests.fake_envs:Crashing-v0",
        env_kwargs={"hard": True},
        num_envs=1,
        num_workers=1,
        faults=FaultSettings(max_worker_restarts=1),
    )
    # The crash recurs in the restarted sampler: one restart, then the budget is spent.
    with pytest.raises(SamplerError, match="died with exit code 3") as e:
        quiet_trainer(max_steps=3).fit(RLModule(obs_dim=3, action_dim=2), datamodule=dm)
    assert re.search(
        r"sampler 0 \(fastlight-sampler-0, pid \d+, env tests.fake_envs:Crashing-v0\) died with exit code 3; "
        r"restart budget exhausted: 1 restarts in the last 600 s",
        str(e.value),
    ), str(e.value)
    assert dm.fault_counters() == {"faults/worker_restarts": 1.0, "faults/dropped_rollouts": 1.0}
    assert_no_children()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"env_id": "highway-fats-v0"}, r"--data.env_id must be a registered gymnasium id.*highway-fast-v0"),
        (
            {"termination_threshold": 1.5},
            r"--data.termination_threshold must be in \[0, 1\] or auto, got 1.5",
        ),
        ({"num_envs": 0}, "--data.num_envs must be >= 1, got 0"),
        (
            {"reset_mode": "vectorised"},
            "--data.reset_mode must be one of dpsa | sgr | autoreset | sequential",
        ),
        ({"num_workers": 0}, "--data.num_workers must be > 0"),
        ({"max_staleness": -1}, "--data.max_staleness must be >= 0"),
        ({"prefetch": 0}, "--data.prefetch must be > 0, got 0"),
        ({"nonfinite": "nan"}, "--data.nonfinite must be one of raise | drop, got 'nan'"),
        ({"start_method": "fork"}, "--data.start_method must be null, spawn or forkserver, got 'fork'"),
        ({"rank_rounds": "node"}, "--data.rank_rounds must be one of auto | together | apart, got 'node'"),
        (
            {"rank_rounds": "together", "reset_mode": "autoreset"},
            "--data.rank_rounds together with --data.max_staleness 0 shares one termination rate, which "
            "needs --data.reset_mode dpsa or sgr",
        ),
        (
            {"rank_rounds": "together", "termination_threshold": "auto"},
            "--data.rank_rounds together with .* needs --data.termination_threshold a number, not auto",
        ),
        (
            {"rank_rounds": "together", "cycles_per_step": 65},
            r"--data.rank_rounds together with .* needs --data.cycles_per_step <= 64 \(.*\), got 65",
        ),
    ],
)
def test_bad_data_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RolloutDataModule(**{"num_envs": 2, "num_workers": 1, **kwargs})


def test_policy_not_matching_env_is_refused():
    dm = RolloutDataModule(env_id="highway-fast-v0", num_envs=1, num_workers=1)
    model = RLModule(obs_dim=25, action_dim=3)  # highway-fast-v0 has 5 discrete actions
    with pytest.raises(ValueError, match="--model.action_dim=3 does not match the env's action_dim=5"):
        quiet_trainer(max_steps=1).fit(model, datamodule=dm)
    assert_no_children()


KILL_SCRIPT = textwrap.dedent(
    """
    import sys
    START = sys.argv[1]
    if START == "forkserver":  # as the fastlight command does first, before Lightning is imported
        from fastlight.fleet.start import warm_forkserver
        assert warm_forkserver("tests.fake_envs:FixedLength-v0")
    import lightning as L
    from fastlight.data.datamodule import RolloutDataModule
    from fastlight.modules.rl_module import RLModule

    class Announce(RLModule):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            if batch_idx == 0:  # a Rollout went through: the samplers work
                print("PIDS", *[p.pid for p in self.trainer.datamodule.pool.procs], flush=True)

    dm = RolloutDataModule(env_id="tests.fake_envs:FixedLength-v0", num_envs=2, num_workers=2)
    L.Trainer(max_steps=100000, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              accelerator="cpu").fit(Announce(obs_dim=3, action_dim=2), datamodule=dm)
    """
)


# SIGKILL under both start methods (the forkserver's children watch the trainer through it); the
# SIGINT teardown is the trainer's own and the same for both, so it runs once.
@pytest.mark.parametrize(
    ("sig", "start"),
    [
        (signal.SIGINT, "spawn"),
        pytest.param(signal.SIGKILL, "spawn", marks=pytest.mark.slow),  # the forkserver case is the default's
        (signal.SIGKILL, "forkserver"),
    ],
)
def test_no_orphans_when_trainer_is_interrupted_or_killed(sig, start):
    """Samplers (and, with a warmed forkserver, the forkserver) never outlive their trainer."""
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, start],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        # A trainer as a terminal starts it: a suite run in the background of a non-interactive
        # shell ignores SIGINT, and a child would inherit that (and never see the Ctrl-C).
        preexec_fn=_default_stop_signals,
    )
    pids: list[int] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("PIDS"):
            pids = [int(p) for p in line.split()[1:]]
            break
    assert len(pids) == 2, "trainer never trained on a Rollout"
    family = descendants(proc.pid)  # the samplers, multiprocessing's resource tracker, the forkserver
    assert set(pids) <= family
    parents = {parent_pid(p) for p in pids}
    if start == "spawn":
        assert parents == {proc.pid}
    else:  # forked by the forkserver, a child of the trainer
        assert parents != {proc.pid} and len(parents) == 1 and parent_pid(parents.pop()) == proc.pid
    time.sleep(1.0)
    ignored = _ignored_signals(proc.pid)
    proc.send_signal(sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(
            f"trainer still alive 30 s after {sig.name}; signals it ignored: {ignored}, this test "
            f"process ignores: {_ignored_signals(os.getpid())}"
        ) from None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(alive(p) for p in family):
        time.sleep(0.2)
    assert not any(alive(p) for p in family), f"orphaned processes after {sig.name} ({start})"


def test_rollouts_are_tensors_on_the_module_device():
    dm = RolloutDataModule(env_id=FIXED, num_envs=2, num_workers=1)

    class Check(RLModule):
        def training_step(self, batch, batch_idx):
            assert isinstance(batch.obs, torch.Tensor) and batch.obs.device == self.device
            batch.validate()
            return super().training_step(batch, batch_idx)

    quiet_trainer(max_steps=1).fit(Check(obs_dim=3, action_dim=2), datamodule=dm)
    assert_no_children()


def test_async_sampling_respects_the_staleness_bound_and_counts_drops():
    class Slow(RecordingModule):
        def training_step(self, batch, batch_idx):
            time.sleep(0.3)  # let samplers run ahead so that old data piles up
            self.dropped = getattr(self, "dropped", 0) + batch.stats.dropped_stale
            return super().training_step(batch, batch_idx)

    dm = RolloutDataModule(
        env_id=FIXED, env_kwargs={"lengths": (2, 3)}, num_envs=2, num_workers=2, max_staleness=1, prefetch=1
    )
    model = Slow(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=1)
    quiet_trainer(max_steps=8).fit(model, datamodule=dm)
    lags = [v - b for v, behaviour in model.seen for b in behaviour]
    assert max(lags) <= 1  # never older than max_staleness
    assert 1 in lags  # and sampling really ran ahead of the trainer
    assert model.dropped > 0 and model.dropped == dm.dropped_stale
    assert_no_children()


def test_cpu_copy_for_the_samplers_is_equal_independent_and_keeps_parameters():
    from fastlight.data.datamodule import cpu_copy
    from fastlight.models.mlp import MLPActorCritic

    policy = MLPActorCritic(3, 2, continuous=True)
    policy.register_buffer("counter", torch.arange(3))
    policy.log_std.requires_grad_(False)
    copy = cpu_copy(policy)
    for (name, a), (_, b) in zip(policy.state_dict().items(), copy.state_dict().items(), strict=True):
        assert torch.equal(a, b), name  # a copy: same values, bit for bit
        assert a.data_ptr() != b.data_ptr(), name  # and no shared storage
    assert all(isinstance(p, torch.nn.Parameter) for p in copy.parameters())
    assert [p.requires_grad for p in copy.parameters()] == [p.requires_grad for p in policy.parameters()]
    with torch.no_grad():
        policy.log_std.add_(1.0)
    assert not torch.equal(policy.log_std, copy.log_std)
