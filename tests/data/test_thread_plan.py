"""The trainer's and a CPU inference worker's torch threads: the cores the samplers leave."""

from __future__ import annotations

import pytest

from fastlight.data import data_settings as dm_module
from fastlight.data.datamodule import RolloutDataModule
from fastlight.inference.settings import InferenceSettings
from fastlight.procs import spare_threads


@pytest.mark.parametrize(
    ("cores", "ranks", "busy", "threads"),
    [(2, 1, 2, 1), (2, 1, 1, 1), (4, 1, 0, 4), (16, 1, 2, 14), (16, 2, 2, 6), (3, 4, 1, 1)],
)
def test_spare_threads_are_the_cores_left_at_least_one(cores, ranks, busy, threads):
    assert spare_threads(cores=cores, ranks=ranks, busy=busy) == threads


@pytest.fixture
def sixteen_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(dm_module, "usable_cores", lambda: 16)


def data(**kw) -> RolloutDataModule:
    return RolloutDataModule(env_id="tests.fake_envs:FixedLength-v0", num_envs=4, num_workers=2, **kw)


@pytest.mark.usefixtures("sixteen_cores")
def test_the_trainer_takes_the_cores_the_samplers_leave_and_shares_them_with_a_cpu_worker():
    assert data().thread_plan(1) == (14, None)
    assert data().thread_plan(2) == (6, None)  # two ranks on the machine: 8 cores each
    trainer, served = data(inference=InferenceSettings(device="cpu")).thread_plan(1)
    assert (trainer, served.threads) == (7, 7)
    assert served.max_batch == InferenceSettings().max_batch  # the rest of the settings kept
    trainer, served = data(inference=InferenceSettings(device="cpu", threads=2)).thread_plan(1)
    assert (trainer, served.threads) == (12, 2)
    trainer, served = data(trainer_threads=3, inference=InferenceSettings(device="cpu")).thread_plan(1)
    assert (trainer, served.threads) == (3, 7)
    # A worker on the trainer's device (device null) is a CPU worker only beside a CPU trainer.
    trainer, served = data(inference=InferenceSettings()).thread_plan(1, "cpu")
    assert (trainer, served.threads) == (7, 7)
    trainer, served = data(inference=InferenceSettings()).thread_plan(1, "cuda:0")
    assert (trainer, served.threads) == (14, None)  # a GPU worker: the trainer keeps the spare cores


def test_omp_num_threads_or_a_remote_fleet_leave_the_threads_alone(monkeypatch):
    from fastlight.fleet.ray.fleet import RayFleet

    monkeypatch.setattr(dm_module, "usable_cores", lambda: 16)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    settings = InferenceSettings(device="cpu")
    assert data(inference=settings).thread_plan(1) == (None, settings)
    assert data(trainer_threads=2).thread_plan(1) == (2, None)  # an explicit setting still holds
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert data(fleet=RayFleet()).thread_plan(1) == (None, None)


def test_bad_thread_counts_name_their_flag():
    with pytest.raises(ValueError, match=r"--data.trainer_threads must be null \(auto\) or >= 1, got 0"):
        data(trainer_threads=0)
    with pytest.raises(ValueError, match=r"--data.inference.threads must be null \(auto\) or >= 1, got 0"):
        InferenceSettings(threads=0)
