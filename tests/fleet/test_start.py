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


def test_peek_value_reads_typed_values_class_paths_and_top_level_settings(tmp_path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "seed_everything: 3\nmodel:\n  class_path: fastlight.RLModule\n"
        "  init_args:\n    hidden_sizes: [32, 32]\n"
        "data:\n  num_envs: 4\n  cut_in_flight: null\n"
    )
    argv = ["--config", str(cfg)]
    assert start.peek_value(argv, None, "seed_everything") == (True, 3)
    assert start.peek_value(argv, "model", "class_path") == (True, "fastlight.RLModule")
    assert start.peek_value(argv, "model", "hidden_sizes") == (True, [32, 32])
    assert start.peek_value(argv, "data", "num_envs") == (True, 4)
    assert start.peek_value(argv, "data", "cut_in_flight") == (True, None)  # set, to null
    assert start.peek_value(argv, "data", "max_staleness") == (False, None)
    # Flags win over config files, are read as YAML, in either spelling.
    flags = [*argv, "--data.num_envs=6", "--model.init_args.hidden_sizes", "[8]", "--model", "my.Module"]
    assert start.peek_value(flags, "data", "num_envs") == (True, 6)
    assert start.peek_value(flags, "model", "hidden_sizes") == (True, [8])
    assert start.peek_value(flags, "model", "class_path") == (True, "my.Module")
    assert start.peek_value(["--seed_everything=true"], None, "seed_everything") == (True, True)
