"""Choosing how samplers start, and reading the env id off a command line before the CLI parses it."""

from __future__ import annotations

import pytest

from fastlight.fleet import start


def test_peek_env_id_reads_flags_and_configs_last_one_wins(tmp_path) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text("data:\n  env_id: merge-v0\n  num_envs: 4\n")
    nested = tmp_path / "nested.yaml"
    nested.write_text("data:\n  class_path: fastlight.data.datamodule.RolloutDataModule\n"
                      "  init_args:\n    env_id: Hopper-v5\n")  # fmt: skip
    other = tmp_path / "other.yaml"
    other.write_text("trainer:\n  max_steps: 3\n")
    assert start.peek_env_id(["--config", str(plain)]) == "merge-v0"
    assert start.peek_env_id([f"--config={nested}"]) == "Hopper-v5"
    assert start.peek_env_id(["--config", str(plain), "--config", str(nested)]) == "Hopper-v5"
    assert start.peek_env_id(["--config", str(nested), "-c", str(other)]) == "Hopper-v5"
    flag_wins = ["--config", str(plain), "--data.env_id", "roundabout-v0"]
    assert start.peek_env_id(flag_wins) == "roundabout-v0"
    assert start.peek_env_id(["--data.env_id=u-turn-v0"]) == "u-turn-v0"
    assert start.peek_env_id(["--config", str(other)]) is None
    assert start.peek_env_id(["--config", str(tmp_path / "missing.yaml")]) is None
    assert start.peek_env_id([]) is None
    assert start.peek_data(["--config", str(plain), "--data.start_method=spawn"], "start_method") == "spawn"


def test_start_method_defaults_to_spawn_unless_a_forkserver_was_warmed(monkeypatch) -> None:
    monkeypatch.setattr(start, "_warm", False)
    assert start.resolve_start_method(None) == "spawn"
    assert start.resolve_start_method("forkserver") == "forkserver"
    monkeypatch.setattr(start, "_warm", True)
    assert start.resolve_start_method(None) == "forkserver"
    assert start.resolve_start_method("spawn") == "spawn"


def test_bad_start_method_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--data.start_method must be null, spawn or forkserver, got 'fork'"):
        start.resolve_start_method("fork")
    from fastlight.data.datamodule import RolloutDataModule

    with pytest.raises(ValueError, match="--data.start_method"):
        RolloutDataModule(
            env_id="tests.fake_envs:FixedLength-v0", num_envs=1, num_workers=1, start_method="x"
        )


def test_peek_data_reads_both_spellings_and_a_config_that_sets_null(tmp_path) -> None:
    first = tmp_path / "first.yaml"
    first.write_text("data:\n  env_id: merge-v0\n  num_envs: 4\n")
    unset = tmp_path / "unset.yaml"
    unset.write_text("data:\n  init_args:\n    env_id: null\n")
    assert start.peek_env_id(["--config", str(first), "--config", str(unset)]) is None  # the last one sets it
    assert start.peek_env_id(["--data.init_args.env_id", "u-turn-v0", "--config", str(first)]) == "u-turn-v0"
    assert start.peek_data(["--config", str(first)], "num_envs") is None  # not a string
    assert start.peek_data(["--data.start_method"], "start_method") is None  # a flag without its value
