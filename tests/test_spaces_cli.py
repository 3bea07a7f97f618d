"""``fastlight fit`` and ``fastlight evaluate`` on the spaces the default policies take natively (the envs
of :mod:`tests.space_envs`): pixels through the Nature-CNN, Dict and Tuple observations with a Discrete
part, MultiDiscrete and MultiBinary actions. Each trains 5 updates and must beat a random policy's
return by a margin (sampled actions, 20 evaluation episodes of 8 steps); a Text part is refused in
one line, and the gymnasium wrapper that line names makes a checkpoint ``fastlight evaluate`` plays."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fastlight import cli
from fastlight.cli import cli_main
from fastlight.evaluate import main as evaluate

ROOT = Path(__file__).resolve().parents[1]


def fit(root: Path, env_id: str, env_kwargs: str = "{}", *extra: str, steps: int = 40):
    """5 rollouts of 8 envs x 8 steps (8 optimizer steps each) from highway's config."""
    return cli_main([
        "fit", "--config", str(ROOT / "configs" / "highway_dpsa.yaml"), "--data.env_id", env_id,
        "--data.env_kwargs", env_kwargs, "--data.num_envs", "8", "--data.num_workers", "1",
        "--data.max_horizon", "8", "--data.cycles_per_step", "1", "--data.steps_per_epoch", "100",
        "--model.update_epochs", "4", "--model.num_minibatches", "2", "--model.lr", "3e-3",
        "--trainer.max_steps", str(steps), "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(root), *extra,
    ])  # fmt: skip


def sampled_return(root: Path) -> float:
    """Mean return of the last checkpoint over 20 episodes of sampled actions."""
    result = evaluate(["--ckpt", str(root / "checkpoints" / "last.ckpt"), "--episodes", "20", "--sample"])
    return result["summary"]["return"]["mean"]


def hparams(root: Path) -> dict:
    ckpt = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    return ckpt["hyper_parameters"]


@pytest.mark.multiproc
def test_the_cnn_policy_learns_which_half_of_the_image_is_lit(tmp_path, capsys):
    fit(tmp_path, "tests.space_envs:Pixels-v0")
    out = capsys.readouterr().out
    assert (
        "fastlight: policy MultiInputActorCritic over image 36x36x3 (Nature-CNN); discrete 2 actions\n" in out
    )
    assert hparams(tmp_path)["spaces"] == {"obs": {"": "image 36x36x3"}, "action": "discrete 2"}
    # A random policy scores 4 of 8 (mean of 20 episodes: std 0.32); 5 updates reached 7.5.
    assert sampled_return(tmp_path) >= 6.5


@pytest.mark.multiproc
@pytest.mark.parametrize("kwargs", ["{}", "{tuple_obs: true}"], ids=["dict", "tuple"])
def test_dict_and_tuple_observations_with_a_discrete_part_train_natively(tmp_path, capsys, kwargs):
    fit(tmp_path, "tests.space_envs:Cue-v0", kwargs)
    parts = "cue: discrete 3, noise: box 2" if kwargs == "{}" else "0: discrete 3, 1: box 2"
    assert f"MultiInputActorCritic over {parts}; discrete 3 actions" in capsys.readouterr().out
    # The reward is for naming the one-hot cue: a random policy scores 8/3 (std of the mean 0.3); 6.7 reached.
    assert sampled_return(tmp_path) >= 5.0


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("kwargs", "action", "floor"),
    [("{}", "multidiscrete 3x3", 4.5), ("{binary: true}", "multibinary 4", 5.2)],
    ids=["multidiscrete", "multibinary"],
)
def test_multidiscrete_and_multibinary_actions_train_natively(tmp_path, kwargs, action, floor):
    """The env asserts each action it receives has its action space's shape. Random policies score 8/3
    (MultiDiscrete) and 4 (MultiBinary, std of the mean 0.16); 5 updates reached 5.85 and 6.09."""
    fit(tmp_path, "tests.space_envs:MultiAction-v0", kwargs)
    assert hparams(tmp_path)["spaces"] == {"obs": {"": "box 3"}, "action": action}
    assert sampled_return(tmp_path) >= floor


def test_a_text_part_is_refused_in_one_line_naming_the_part_and_the_wrapper(tmp_path, monkeypatch, capsys):
    argv = [
        "fit", "--config", str(ROOT / "configs" / "highway_dpsa.yaml"), "--data.env_id",
        "tests.space_envs:Mission-v0", "--data.env_kwargs", "{}", "--data.num_workers", "1",
        "--trainer.default_root_dir", str(tmp_path),
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["fastlight", *argv])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("fastlight: error:")]
    assert "the observation part 'mission' is Text(" in line, line
    assert "gymnasium.wrappers.FilterObservation, init_args: {filter_keys: [cue, noise]}" in line, line


@pytest.mark.multiproc
def test_evaluate_plays_a_checkpoint_inside_the_wrapper_the_refusal_named(tmp_path):
    wrapper = "[{class_path: gymnasium.wrappers.FilterObservation, init_args: {filter_keys: [cue, noise]}}]"
    fit(tmp_path, "tests.space_envs:Mission-v0", "{}", "--data.env_wrappers", wrapper, steps=8)
    assert hparams(tmp_path)["spaces"]["obs"] == {"cue": "discrete 3", "noise": "box 2"}
    result = evaluate(["--ckpt", str(tmp_path / "checkpoints" / "last.ckpt"), "--episodes", "2"])
    assert result["env_id"] == "tests.space_envs:Mission-v0" and len(result["episodes"]) == 2
    assert [e["length"] for e in result["episodes"]] == [8, 8]
