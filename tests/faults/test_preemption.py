"""PreemptionCheckpoint in one process: a stop signal during an update stops right after it, one
outside an update stops at once, both with a loadable checkpoint and the signal's exit code; the
timer saves; a resume already past max_steps says so; the handlers are given back after fit;
further stop signals during the stop save are ignored (one line each) until it is on disk; a signal
during a timer save waits for it; a full disk stops the run in one line naming what to resume."""

from __future__ import annotations

import errno
import os
import signal

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from fastlight.callbacks.preemption import Preempted, PreemptionCheckpoint
from fastlight.checkpoints import AtomicCheckpointIO, CheckpointWriteError, verify_checksum
from fastlight.modules.rl_module import RLModule
from fastlight.rollout import Rollout
from fastlight.sampling.collector import Collector
from tests.fake_envs import FixedLengthEnv

STEPS_PER_UPDATE = 2  # update_epochs 1 x num_minibatches 2
STOP = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def rollout() -> Rollout:
    torch.manual_seed(0)
    envs = [FixedLengthEnv(lengths=(3, 5), tag=i) for i in range(2)]
    module = RLModule(obs_dim=3, action_dim=2)
    module.configure_model()
    return Collector(envs, mode="dpsa", max_horizon=6).collect(module.policy)


class Rollouts(IterableDataset):
    """``n`` copies of one Rollout."""

    def __init__(self, n: int) -> None:
        self.item, self.n = rollout(), n

    def __iter__(self):
        return iter([self.item] * self.n)


class SignalInUpdate(RLModule):
    """Sends ``signum`` to itself in the middle of update number ``at`` (0-based), or while it
    waits for the batch of update ``wait_at`` (where RolloutDataModule waits for the samplers)."""

    def __init__(self, signum: int = 0, at: int = -1, wait_at: int = -1, **kw) -> None:
        super().__init__(obs_dim=3, action_dim=2, update_epochs=1, num_minibatches=2, **kw)
        self.signum, self.at, self.wait_at = signum, at, wait_at

    def on_before_batch_transfer(self, batch, dataloader_idx):
        if self.policy_version == self.wait_at:
            os.kill(os.getpid(), self.signum)
            for _ in range(1000):  # the handler runs between bytecodes, as in a queue wait
                pass
        return batch

    def training_step(self, batch, batch_idx):
        if batch_idx == self.at:
            os.kill(os.getpid(), self.signum)
        return super().training_step(batch, batch_idx)


def trainer(tmp_path, cb: PreemptionCheckpoint, **kw) -> L.Trainer:
    return L.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        callbacks=[cb],
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(tmp_path),
        **kw,
    )


def saved_step(path) -> int:
    return int(torch.load(path, weights_only=False)["global_step"])


@pytest.fixture
def python_sigint():
    """Python's own Ctrl-C behaviour during the test (a shell's background job starts with SIGINT
    ignored, and the test checks that the fit gives back what it found)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_signal_during_update_stops_after_it_with_checkpoint(tmp_path, signum, capsys, python_sigint):
    cb = PreemptionCheckpoint(every_minutes=None)
    t = trainer(tmp_path, cb, max_steps=100)
    with pytest.raises(Preempted) as info:
        t.fit(SignalInUpdate(signum=signum, at=2), DataLoader(Rollouts(50), batch_size=None))
    assert info.value.code == 128 + signum  # 143 / 130 / 138
    # Update 2 (0-based) was completed, not cut: 3 updates' optimizer steps are in the checkpoint.
    assert saved_step(tmp_path / "checkpoints" / "last.ckpt") == 3 * STEPS_PER_UPDATE
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"fastlight: stopped by {signal.Signals(signum).name} at global step 6")
    assert str(tmp_path / "checkpoints" / "last.ckpt") in line
    # Outside the fastlight command there is no --ckpt_path flag: the line says how a script resumes.
    last = str(tmp_path / "checkpoints" / "last.ckpt")
    assert line.endswith(f"(resume with trainer.fit(..., ckpt_path={last!r}))")
    # The handlers are given back: the process's own SIGINT behaviour is back after the fit.
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs between bytecodes
            pass


def test_signal_while_waiting_for_data_stops_at_once(tmp_path):
    cb = PreemptionCheckpoint(every_minutes=None)
    t = trainer(tmp_path, cb, max_steps=100)
    module = SignalInUpdate(signum=signal.SIGTERM, wait_at=4)
    with pytest.raises(Preempted) as info:
        t.fit(module, DataLoader(Rollouts(50), batch_size=None))
    assert info.value.code == 143
    # Updates 0..3 ran; the wait for update 4's batch was cut short, and no further update ran.
    assert saved_step(tmp_path / "checkpoints" / "last.ckpt") == 4 * STEPS_PER_UPDATE
    assert module.policy_version == 4


def test_timer_saves_during_training_and_at_the_end(tmp_path, caplog):
    timed = PreemptionCheckpoint(every_minutes=1e-9)  # due after every update
    with caplog.at_level("INFO", logger="lightning.pytorch"):
        trainer(tmp_path / "a", timed, max_steps=6 * STEPS_PER_UPDATE).fit(
            SignalInUpdate(), DataLoader(Rollouts(50), batch_size=None)
        )
    # Full checkpoints, asked for as such: Lightning's "weights_only was not set" line never shows.
    assert not [r for r in caplog.records if "weights_only" in r.getMessage()]
    untimed = PreemptionCheckpoint(every_minutes=None)
    trainer(tmp_path / "b", untimed, max_steps=6 * STEPS_PER_UPDATE).fit(
        SignalInUpdate(), DataLoader(Rollouts(50), batch_size=None)
    )
    assert timed.saves == 6 + 1  # after each of the 6 updates, and at the end of training
    assert untimed.saves == 1  # only at the end of training
    assert saved_step(tmp_path / "b" / "checkpoints" / "last.ckpt") == 6 * STEPS_PER_UPDATE


def test_resume_past_max_steps_says_so(tmp_path, capsys):
    first = trainer(tmp_path, PreemptionCheckpoint(every_minutes=None), max_steps=4 * STEPS_PER_UPDATE)
    first.fit(SignalInUpdate(), DataLoader(Rollouts(50), batch_size=None))
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    again = trainer(tmp_path, PreemptionCheckpoint(every_minutes=None), max_steps=2 * STEPS_PER_UPDATE)
    module = SignalInUpdate()
    again.fit(module, DataLoader(Rollouts(50), batch_size=None), ckpt_path=str(ckpt))
    err = capsys.readouterr().err
    assert "nothing to train" in err and "global step 8" in err and "--trainer.max_steps 4" in err
    assert module.policy_version == 4  # restored, not trained


def test_bad_every_minutes_is_refused():
    with pytest.raises(ValueError, match="every_minutes must be > 0 or null, got 0"):
        PreemptionCheckpoint(every_minutes=0)


class SignalsWhenSaved(SignalInUpdate):
    """Stops with ``signum`` in update ``at``; the stop checkpoint's state then sends ``later`` (each
    signal in turn) to this process while Lightning gathers it and torch.save pickles it."""

    def __init__(self, later: tuple[int, ...] = (), **kw) -> None:
        super().__init__(**kw)
        self.later = later

    def on_save_checkpoint(self, checkpoint):
        super().on_save_checkpoint(checkpoint)
        checkpoint["probe"] = SendWhenPickled(self.later)


class SendWhenPickled:
    """Sends its signals to this process when pickled (inside ``torch.save``); loads as ``0``."""

    def __init__(self, signums: tuple[int, ...]) -> None:
        self.signums = signums

    def __reduce__(self):
        for signum in self.signums:
            os.kill(os.getpid(), signum)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        return (int, (0,))


def fastlight_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("fastlight: ")]


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_second_signals_during_the_stop_save_are_ignored_until_it_is_on_disk(
    tmp_path, second, capfd, python_sigint
):
    cb = PreemptionCheckpoint(every_minutes=None)
    t = trainer(tmp_path, cb, max_steps=100)
    module = SignalsWhenSaved(signum=signal.SIGTERM, at=1, later=(second, second))
    with pytest.raises(Preempted) as info:  # not KeyboardInterrupt, not the second signal's code
        t.fit(module, DataLoader(Rollouts(50), batch_size=None))
    assert info.value.code == 143
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert verify_checksum(ckpt) is True and saved_step(ckpt) == 2 * STEPS_PER_UPDATE
    assert cb.ignored_signals == 2 and cb.saves == 1
    name = signal.Signals(second).name
    lines = fastlight_lines(capfd.readouterr().err)
    assert lines[:2] == [
        f"fastlight: {name} ignored (stop signal {n}): the run stops once its checkpoint is on disk; "
        "SIGKILL stops it at once, without one"
        for n in (2, 3)
    ]
    assert lines[2].startswith("fastlight: stopped by SIGTERM at global step 4; checkpoint saved to ")
    assert len(lines) == 3


def test_signal_while_a_periodic_checkpoint_is_written_stops_after_it(tmp_path, monkeypatch, capfd):
    """A SIGTERM inside torch.save's writes (where it used to become ``RuntimeError: unexpected
    pos``, exit 1) waits until the file is on disk, then stops the run with 143."""
    from fastlight import checkpoints

    real_write, writers, calls = checkpoints._HashingWriter.write, [], []

    def write(self, data):
        if self not in writers:
            writers.append(self)  # one per save
        calls.append(self)
        if len(writers) == 2 and calls.count(self) == 5:  # in the middle of the second save
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
        return real_write(self, data)

    monkeypatch.setattr(checkpoints._HashingWriter, "write", write)
    cb = PreemptionCheckpoint(every_minutes=1e-9)  # a save after every update
    t = trainer(tmp_path, cb, max_steps=100)
    with pytest.raises(Preempted) as info:
        t.fit(SignalInUpdate(), DataLoader(Rollouts(50), batch_size=None))
    assert info.value.code == 143
    # The save it came in finished (no third write for the stop), and holds that update.
    assert len(writers) == 2 and cb.saves == 2
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert verify_checksum(ckpt) is True and saved_step(ckpt) == 2 * STEPS_PER_UPDATE
    [line] = fastlight_lines(capfd.readouterr().err)
    assert line.startswith("fastlight: stopped by SIGTERM at global step 4; checkpoint saved to ")


class FillsDiskAfter(SignalInUpdate):
    """After update ``full_at`` (0-based), the next write of ``path`` meets a full device: its
    temporary file is made a link to /dev/full, where every write fails with ENOSPC (the kernel's
    own, through the real torch.save)."""

    def __init__(self, path: str, full_at: int) -> None:
        super().__init__()
        self.path, self.full_at = path, full_at

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.policy_version == self.full_at + 1:
            folder, name = os.path.split(self.path)
            os.symlink("/dev/full", os.path.join(folder, f".{name}.tmp-{os.getpid()}"))


def test_full_disk_during_a_periodic_save_stops_in_one_line(tmp_path, capfd):
    cb = PreemptionCheckpoint(every_minutes=1e-9)
    t = trainer(tmp_path, cb, max_steps=100)
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(CheckpointWriteError) as info:
        t.fit(FillsDiskAfter(str(ckpt), full_at=1), DataLoader(Rollouts(50), batch_size=None))
    assert info.value.errno == errno.ENOSPC
    [line] = fastlight_lines(capfd.readouterr().err)
    assert line.startswith(
        f"fastlight: stopped by CheckpointWriteError at global step 6: could not save checkpoint {ckpt}: "
        "No space left on device (ENOSPC); it needs about "
    )
    assert "free of " in line and line.endswith(f"; last good checkpoint to resume from: {ckpt} (unchanged)")
    assert os.listdir(ckpt.parent) == ["last.ckpt"]  # the temporary name is gone
    assert verify_checksum(ckpt) is True and saved_step(ckpt) == 2 * STEPS_PER_UPDATE
    assert cb.saves == 2  # the failed save was not tried a second time at the stop


def test_handler_is_installed_through_lightnings_signal_connector(tmp_path):
    """Lightning's SIGTERM notifier (which forwards the signal and enters a broadcast inside the
    handler) never runs: during fit the one handler of every stop signal is the callback's, held by
    Lightning's connector, which gives the previous ones back at the end; Lightning's own flag stays
    down (its loops would stop one rank alone)."""
    from fastlight.lightning_compat import StopSignalConnector

    seen: dict = {}

    class Look(SignalInUpdate):
        def training_step(self, batch, batch_idx):
            seen["handlers"] = {
                s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
            }
            seen["connector"] = self.trainer._signal_connector
            return super().training_step(batch, batch_idx)

    before = {s: signal.getsignal(s) for s in STOP}
    cb = PreemptionCheckpoint(every_minutes=None)
    t = trainer(tmp_path, cb, max_steps=100)
    with pytest.raises(Preempted):
        t.fit(Look(signum=signal.SIGTERM, at=1), DataLoader(Rollouts(50), batch_size=None))
    assert isinstance(seen["connector"], StopSignalConnector)
    assert set(seen["handlers"].values()) == {cb._on_signal}
    assert not t.received_sigterm
    assert {s: signal.getsignal(s) for s in before} == before


class ClaimsStop(L.Callback):
    """A :class:`~fastlight.callbacks.preemption.HandlesStop` that claims exceptions of ``kind``."""

    def __init__(self, kind: type[BaseException]) -> None:
        self.kind, self.asked = kind, 0

    def handles_stop(self, trainer, exception) -> bool:
        self.asked += 1
        return isinstance(exception, self.kind)


class FailsInUpdate(SignalInUpdate):
    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            raise RuntimeError("a collective failed")
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("kind", [RuntimeError, KeyError])
def test_a_callback_that_handles_the_stop_takes_it_over(tmp_path, kind, capsys):
    """LostRankCheckpoint's way in: a callback that claims the exception leaves PreemptionCheckpoint
    no save and no line; one that does not claim it changes nothing."""
    cb, claims = PreemptionCheckpoint(every_minutes=None), ClaimsStop(kind)
    t = trainer(tmp_path, cb, max_steps=100)
    t.callbacks.append(claims)
    with pytest.raises(RuntimeError, match="a collective failed"):
        t.fit(FailsInUpdate(), DataLoader(Rollouts(50), batch_size=None))
    assert claims.asked == 1
    lines = fastlight_lines(capsys.readouterr().err)
    if kind is RuntimeError:
        assert lines == [] and cb.saves == 0 and not (tmp_path / "checkpoints").exists()
    else:
        ckpts = tmp_path / "checkpoints"
        last = ckpts / "last.ckpt"
        assert lines == [
            f"fastlight: stopped by RuntimeError at global step 4: a collective failed; checkpoint saved to "
            f"{last} (resume with trainer.fit(..., ckpt_path={str(last)!r})); traceback in "
            f"{ckpts / 'traceback.txt'}"
        ]
        assert "RuntimeError: a collective failed" in (tmp_path / "checkpoints" / "traceback.txt").read_text()
        assert saved_step(tmp_path / "checkpoints" / "last.ckpt") == 4


class RefusedInSetup(SignalInUpdate):
    def setup(self, stage: str) -> None:
        raise ValueError("--model.x must be > 0, got 0")


@pytest.mark.parametrize("command", [False, True])
def test_a_refusal_before_training_is_one_stop_line_unless_the_command_says_it(tmp_path, capsys, command):
    """In a Lightning project of its own, a refusal found as the fit starts gets the stop line; under the
    ``fastlight`` command (which sets ``refusal``), its own ``fastlight: error:`` line is the one line."""
    cb = PreemptionCheckpoint(dirpath=str(tmp_path / "checkpoints"))
    cb.refusal = (lambda e: str(e)) if command else None
    with pytest.raises(ValueError, match="--model.x must be > 0"):
        trainer(tmp_path, cb, max_steps=4).fit(RefusedInSetup(), DataLoader(Rollouts(2), batch_size=None))
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("fastlight: ")]
    stop = "fastlight: stopped by ValueError before training started: --model.x must be > 0, got 0; no "
    assert [ln[: len(stop)] for ln in said] == ([] if command else [stop])
    assert not list(tmp_path.rglob("*.ckpt"))
