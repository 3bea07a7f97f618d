"""A value on the command line means what it means in a YAML file, at every depth (issue 39: ``null`` two
classes deep arrived as the string ``'None'``), and a later ``--config`` file's ``env_kwargs`` update the
earlier ones key by key, as the dotted flag does. Parsed with fastlight's parser and the CLI's own nesting
(``--model`` and ``--data`` in subclass mode), without building anything."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing

import lightning as L
import pytest
from jsonargparse import ActionConfigFile

from fastlight.cli_parser import FastlightArgumentParser
from fastlight.fleet.ray.fleet import RayFleet
from fastlight.inference.settings import InferenceSettings
from fastlight.modules.rl_module import RLModule
from fastlight.vla.policy import VLAPolicy

RAY_FLEET = "fastlight.fleet.ray.fleet.RayFleet"
BASE = ["--model", "fastlight.RLModule", "--data", "fastlight.RolloutDataModule"]


def parse(*args: str):
    parser = FastlightArgumentParser(parser_mode="omegaconf", exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_lightning_class_args(RLModule, "model", subclass_mode=True)
    parser.add_lightning_class_args(L.LightningDataModule, "data", subclass_mode=True)
    return parser.parse_args([*BASE, *args])


def nullable(cls: type) -> list[str]:
    """``cls``'s settings that take ``None`` (``x: T | None``)."""
    hints = typing.get_type_hints(cls.__init__)
    out = []
    for p in inspect.signature(cls.__init__).parameters.values():
        hint = hints.get(p.name)
        args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else ()
        if type(None) in args:
            out.append(p.name)
    return out


def test_every_nullable_policy_setting_takes_null_two_classes_deep():
    names = nullable(VLAPolicy)
    assert {"backbone", "image_size", "lora", "action_token_ids"} <= set(names), names
    for name in names:
        cfg = parse(
            "--model.policy.class_path", "fastlight.VLAPolicy", f"--model.policy.init_args.{name}", "null"
        )
        assert cfg.model.init_args.policy.init_args[name] is None, name
    # The short form (no init_args) and other YAML values keep their meaning too.
    cfg = parse(
        "--model.policy", "fastlight.VLAPolicy", "--model.policy.image_size", "null",
        "--model.policy.init_args.action_token_ids", "[3, 5]", "--model.policy.init_args.temperature", "1e-3",
        "--model.policy.init_args.lora", "{r: 4, alpha: 8, target_modules: [q_proj]}",
    )  # fmt: skip
    policy = cfg.model.init_args.policy.init_args
    assert policy.image_size is None and policy.action_token_ids == [3, 5] and policy.temperature == 1e-3
    assert policy.lora.init_args.r == 4 if "init_args" in policy.lora else policy.lora.r == 4


def test_fleet_inference_and_env_settings_take_null_on_the_command_line():
    fleet = [f.name for f in dataclasses.fields(RayFleet) if f.default is not None and "None" in str(f.type)]
    for name in ["address", "sampler_resources", "inference_resources", *fleet]:
        cfg = parse(
            "--data.fleet",
            RAY_FLEET,
            "--data.fleet.address",
            "auto",
            f"--data.fleet.init_args.{name}",
            "null",
        )
        assert cfg.data.init_args.fleet.init_args[name] is None, name
    for f in dataclasses.fields(InferenceSettings):
        if "None" in str(f.type):
            cfg = parse("--data.inference", "{}", f"--data.inference.{f.name}", "null")
            assert cfg.data.init_args.inference[f.name] is None, f.name
    cfg = parse(
        "--data.env_kwargs", "{a: 1}", "--data.env_kwargs.b", "null", "--data.env_kwargs.c", "[1, null]"
    )
    assert cfg.data.init_args.env_kwargs == {"a": 1, "b": None, "c": [1, None]}
    assert parse("--model.init_from", "null").model.init_args.init_from is None  # one level: as before


def test_the_flags_a_nested_help_prints_parse():
    cfg = parse(
        "--model.objective", "GIPO", "--model.objective.sigma", "0.3"
    )  # `--model.objective.help GIPO`
    assert cfg.model.init_args.objective.init_args.sigma == 0.3


@pytest.fixture
def configs(tmp_path):
    first = tmp_path / "first.yaml"
    first.write_text(
        "data:\n  class_path: fastlight.RolloutDataModule\n  init_args:\n"
        "    env_kwargs: {max_path_length: 50, reward_scale: 0.1, config: {lanes: 3, duration: 20}}\n"
    )
    second = tmp_path / "second.yaml"
    second.write_text("data:\n  init_args:\n    env_kwargs: {image: true, config: {duration: 40}}\n")
    return str(first), str(second)


def test_a_later_config_files_env_kwargs_update_the_earlier_ones(configs):
    first, second = configs
    cfg = parse("--config", first, "--config", second)
    assert cfg.data.init_args.env_kwargs == {
        "max_path_length": 50, "reward_scale": 0.1, "image": True, "config": {"lanes": 3, "duration": 40},
    }  # fmt: skip
    # The dotted flag between them is kept; a whole dict on the command line still replaces.
    cfg = parse("--config", first, "--data.env_kwargs.reward_scale", "1.0", "--config", second)
    assert cfg.data.init_args.env_kwargs["reward_scale"] == 1.0
    assert (
        parse("--config", first, "--config", second, "--data.env_kwargs", "{}").data.init_args.env_kwargs
        == {}
    )


def test_max_steps_that_is_not_a_whole_rollout_says_where_training_stops(tmp_path, capsys):
    """--trainer.max_steps counts optimizer steps; Lightning stops at the first rollout that reaches it."""
    from fastlight.cli import cli_main

    cli_main(
        ["--model", "fastlight.RLModule", "--model.update_epochs", "4", "--model.num_minibatches", "4",
         "--data", "fastlight.RolloutDataModule", "--data.env_id", "tests.fake_envs:FixedLength-v0",
         "--data.num_envs", "1", "--data.num_workers", "1", "--trainer.max_steps", "3",
         "--trainer.default_root_dir", str(tmp_path)],
        run=False,
    )  # fmt: skip
    assert (
        "fastlight: --trainer.max_steps 3 counts optimizer steps, 16 per rollout (--model.update_epochs x "
        "--model.num_minibatches): training stops after the rollout that reaches it, at step 16"
    ) in capsys.readouterr().err
