"""Observation and action spaces from the command line: a Dict observation trains with the MLP policy
through gymnasium's own ``FlattenObservation`` in ``--data.env_wrappers`` (without it, the
MultiInputActorCritic takes it: tests/test_spaces_cli.py); an action space no policy of fastlight takes
(a MultiDiscrete of 2 dims) stops the run in one line saying what to do."""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path

import pytest
import torch

from fastlight import cli
from fastlight.cli import cli_main

ROOT = Path(__file__).resolve().parents[2]
FLATTEN = "[{class_path: gymnasium.wrappers.FlattenObservation}]"


def settings(root: Path, env_id: str, *extra: str) -> list[str]:
    return [
        "fit", "--config", str(ROOT / "configs" / "highway_dpsa.yaml"), "--data.env_id", env_id,
        "--data.env_kwargs", "{}", "--data.num_envs", "2", "--data.num_workers", "1",
        "--data.max_horizon", "5", "--data.steps_per_epoch", "1", "--model.update_epochs", "1",
        "--model.num_minibatches", "1",
        "--trainer.max_steps", "1", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(root), *extra,
    ]  # fmt: skip


def one_line(argv: list[str], monkeypatch, capsys) -> str:
    monkeypatch.setattr(sys, "argv", ["fastlight", *argv])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("fastlight: error:")]
    return line


@pytest.mark.multiproc
def test_a_dict_observation_trains_with_the_mlp_policy_through_gymnasiums_wrapper(tmp_path):
    built = cli_main(settings(tmp_path, "tests.fake_envs:DictObs-v0", "--data.env_wrappers", FLATTEN))
    assert built.datamodule.obs_dim == 5  # state (3) + flag (2)
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert ckpt["global_step"] == 1
    # The checkpoint records the wrapper as a config writes it.
    (wrapper,) = ckpt["datamodule_hyper_parameters"]["env_wrappers"]
    assert wrapper["class_path"] == "gymnasium.wrappers.FlattenObservation"
    assert multiprocessing.active_children() == []


def test_a_dict_observation_without_flattening_is_described_for_the_multi_input_policy():
    from fastlight.data.datamodule import RolloutDataModule

    dm = RolloutDataModule(env_id="tests.fake_envs:DictObs-v0", num_envs=1, num_workers=1)
    assert dm.obs_dim == 0 and dm.spaces == {
        "obs": {"flag": "box 2", "state": "box 3"},
        "action": "discrete 2",
    }


def test_an_action_space_no_policy_takes_is_one_line_naming_the_supported_ones(tmp_path, monkeypatch, capsys):
    argv = settings(
        tmp_path, "tests.fake_envs:MultiDiscrete-v0", "--data.env_kwargs", "{nvec: [[3, 3], [2, 2]]}"
    )
    line = one_line(argv, monkeypatch, capsys)
    assert "MultiDiscrete([[3 3] [2 2]]) is not supported" in line, line
    assert "Discrete, Box, MultiDiscrete or MultiBinary (one dim)" in line, line


def test_a_gymnasium_wrapper_class_works_from_python_too():
    import functools
    import pickle

    import gymnasium as gym

    from fastlight.data.datamodule import RolloutDataModule

    dm = RolloutDataModule(
        env_id="tests.fake_envs:DictObs-v0", num_envs=1, num_workers=1,
        env_wrappers=[
            gym.wrappers.FlattenObservation, functools.partial(gym.wrappers.TimeLimit, max_episode_steps=3)
        ],
    )  # fmt: skip
    assert dm.obs_dim == 5
    assert dm.hparams.env_wrappers == [
        {"class_path": "gymnasium.wrappers.transform_observation.FlattenObservation", "init_args": {}},
        {"class_path": "gymnasium.wrappers.common.TimeLimit", "init_args": {"max_episode_steps": 3}},
    ]
    pickle.dumps(dm.sampler_configs(0))  # what the samplers receive


@pytest.mark.multiproc
def test_evaluate_plays_a_dict_observation_checkpoint_inside_its_wrappers(tmp_path):
    from fastlight.evaluate import main as evaluate

    cli_main(settings(tmp_path, "tests.fake_envs:DictObs-v0", "--data.env_wrappers", FLATTEN))
    result = evaluate(["--ckpt", str(tmp_path / "checkpoints" / "last.ckpt"), "--episodes", "2"])
    assert result["env_id"] == "tests.fake_envs:DictObs-v0" and len(result["episodes"]) == 2


def test_a_vla_config_on_an_env_without_instructions_is_one_line(tmp_path, monkeypatch, capsys):
    """Refused by VLAModule.check_env_spec as the CLI builds the run, not by an AttributeError from
    configure_optimizers once the fit has wrapped the policy for a Box observation."""
    argv = [
        "fit", "--config", str(ROOT / "configs" / "vla_metaworld_reach.yaml"),
        "--data.env_id", "tests.fake_envs:ActionEcho-v0", "--data.env_kwargs", "{action_dim: 4}",
        "--data.num_workers", "1", "--data.num_envs", "1", "--trainer.default_root_dir", str(tmp_path),
    ]  # fmt: skip
    line = one_line(argv, monkeypatch, capsys)
    assert "VLAModule needs a dict observation with 'instruction_ids'" in line and "got Box(" in line, line


@pytest.mark.multiproc
def test_evaluate_plays_a_multidiscrete_checkpoint_through_its_action_wrapper(tmp_path):
    """Trained through an ActionWrapper (a MultiDiscrete env trains without one too); evaluate checks the
    wrapped env's spaces (it used to refuse the unwrapped MultiDiscrete one)."""
    from fastlight.evaluate import main as evaluate

    wrapper = "[{class_path: tests.fake_envs.FlatMultiDiscrete}]"
    cli_main(settings(tmp_path, "tests.fake_envs:MultiDiscrete-v0", "--data.env_wrappers", wrapper))
    result = evaluate(["--ckpt", str(tmp_path / "checkpoints" / "last.ckpt"), "--episodes", "2"])
    assert result["env_id"] == "tests.fake_envs:MultiDiscrete-v0" and len(result["episodes"]) == 2
