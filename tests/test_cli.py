"""`fastlight` CLI: every config and callback fragment parses and runs one tiny step."""

from __future__ import annotations

import glob
import importlib
import os
import subprocess
import sys

import pytest

from fastlight.cli import cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))
#: Configs of supervised stages (DemoDataModule), run by test_vla_sft_then_rl_chain.
SFT_CONFIGS = [c for c in CONFIGS if c.endswith("_sft.yaml")]
RL_CONFIGS = [c for c in CONFIGS if c not in SFT_CONFIGS]
FRAGMENTS = sorted(glob.glob(os.path.join(ROOT, "callbacks", "*.yaml")))

#: Shrinks any config to a one-step smoke run (keys every RolloutDataModule accepts).
TINY = [
    "--trainer.max_steps",
    "1",
    "--data.num_workers",
    "1",
    "--data.steps_per_epoch",
    "1",
    "--trainer.enable_progress_bar",
    "false",
]


def tiny_overrides() -> list[str]:
    """The same shrinking for every config (the configs' own settings are checked apart)."""
    return TINY + ["--data.num_envs", "2", "--data.max_horizon", "5"]


def overridden(section: str) -> set[str]:
    """Keys of ``section`` ("data", "trainer") that :func:`tiny_overrides` sets on the command line."""
    return {a.split(".", 1)[1] for a in tiny_overrides() if a.startswith(f"--{section}.")}


def resolve(class_path: str) -> type:
    module, name = class_path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def test_configs_are_found_and_parse():
    import yaml

    assert len(CONFIGS) >= 3, CONFIGS  # an empty glob would silently skip test_config_runs_one_step
    for config in CONFIGS:
        with open(config) as f:
            spec = yaml.safe_load(f)
        assert {"seed_everything", "trainer", "model", "data"} <= set(spec), config
        assert spec["model"]["class_path"] and spec["data"]["class_path"], config


@pytest.mark.multiproc
@pytest.mark.parametrize("config", RL_CONFIGS, ids=os.path.basename)
def test_config_runs_one_step(config, tmp_path):
    import yaml

    with open(config) as f:
        spec = yaml.safe_load(f)
    # A config that starts from another run's checkpoint runs here from scratch; the chain itself
    # is test_vla_sft_then_rl_chain.
    no_init = ["--model.init_from", "null"] if "init_from" in spec["model"]["init_args"] else []
    cli = cli_main(
        ["fit", "--config", config, *tiny_overrides(), *no_init, "--trainer.default_root_dir", str(tmp_path)]
    )
    # The run is the one the YAML describes: its classes, ...
    assert type(cli.model) is resolve(spec["model"]["class_path"])
    assert type(cli.datamodule) is resolve(spec["data"]["class_path"])
    # ... every model and data setting it writes (but the ones shrunk for the test), ...
    for key, value in spec["model"]["init_args"].items():
        if key == "policy":  # injected: that class was built, with the config's init_args
            assert type(cli.model.policy) is resolve(value["class_path"])
            assert cli.model.hparams.policy["class_path"] == value["class_path"]
            for name, arg in value.get("init_args", {}).items():
                assert cli.model.hparams.policy["init_args"][name] == arg, (key, name)
                if hasattr(cli.model.policy, name):  # the object itself, where it keeps the setting
                    assert getattr(cli.model.policy, name) == arg, (key, name)
            continue
        if key == "init_from":
            continue
        assert cli.model.hparams[key] == value, key
    data = {k: v for k, v in spec["data"]["init_args"].items() if k not in overridden("data")}
    assert data, "the config sets nothing but what the test overrides"
    for key, value in data.items():
        assert cli.datamodule.hparams[key] == value, key
    assert cli.config.fit.seed_everything == spec["seed_everything"]
    assert cli.trainer.log_every_n_steps == spec["trainer"]["log_every_n_steps"]
    # ... and its callbacks, with their arguments.
    attached = {type(c): c for c in cli.trainer.callbacks}
    for cb in spec["trainer"]["callbacks"]:
        cls = resolve(cb["class_path"])
        assert cls in attached, cb["class_path"]
        for key, value in cb.get("init_args", {}).items():
            # ModelCheckpoint keeps some settings private and parsed (train_time_interval: a timedelta)
            obj = attached[cls]
            got = getattr(obj, key) if hasattr(obj, key) else getattr(obj, f"_{key}")
            assert got == value or str(got) == str(value), (cb["class_path"], key, got)
    # One tiny step ran: one rollout (one weight version) = update_epochs x num_minibatches
    # optimizer steps of the config's model, with the test's sizes.
    hp = cli.model.hparams
    assert cli.trainer.global_step == hp.update_epochs * hp.num_minibatches
    assert cli.model.policy_version == 1
    assert cli.datamodule.hparams.num_envs == 2 and cli.datamodule.hparams.max_horizon == 5
    # Sizes were linked from the data module's env, not written in the config.
    assert "obs_dim" not in spec["model"]["init_args"]
    assert (cli.model.hparams.obs_dim, cli.model.hparams.action_dim, cli.model.hparams.continuous) == (
        cli.datamodule.obs_dim,
        cli.datamodule.action_dim,
        cli.datamodule.continuous,
    )
    assert os.listdir(tmp_path)  # logs / checkpoints went under the root dir


@pytest.mark.multiproc
@pytest.mark.parametrize("fragment", FRAGMENTS, ids=os.path.basename)
def test_callback_fragment_attaches(fragment, tmp_path):
    import yaml

    wanted = [
        c["class_path"].rsplit(".", 1)[1] for c in yaml.safe_load(open(fragment))["trainer"]["callbacks+"]
    ]
    # A base config that attaches no callbacks of its own (highway_dpsa.yaml already has a
    # ThroughputMonitor, and Lightning refuses two callbacks with the same state key), on a
    # multi-task env (DWR refuses an env without task weights).
    config = os.path.join(ROOT, "examples", "merge.yaml")
    multi_task = ["--data.env_id", "tests.fake_envs:TwoTask-v0", "--data.reset_mode", "autoreset"]
    cli = cli_main(
        [
            "fit",
            "--config",
            config,
            "--config",
            fragment,
            *tiny_overrides(),
            *multi_task,
            "--trainer.default_root_dir",
            str(tmp_path),
        ]
    )
    names = [type(c).__name__ for c in cli.trainer.callbacks]
    for name in wanted:
        assert name in names


def test_print_config_shows_the_full_config():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastlight.cli",
            "fit",
            "--config",
            os.path.join(ROOT, "configs", "highway_dpsa.yaml"),
            "--print_config",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for key in (
        "termination_threshold: 0.5",
        "reset_mode: dpsa",
        "class_path: fastlight.modules.rl_module.RLModule",
        "gae_lambda: 0.95",
        "max_staleness: 0",
    ):
        assert key in out.stdout, key


def test_cli_error_names_the_flag():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastlight.cli",
            "fit",
            "--config",
            os.path.join(ROOT, "configs", "highway_dpsa.yaml"),
            "--data.termination_threshold",
            "1.5",
            "--trainer.max_steps",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode != 0
    assert "--data.termination_threshold must be in [0, 1], got 1.5" in out.stderr


@pytest.mark.multiproc
def test_vla_sft_then_rl_chain(tmp_path):
    """configs/vla_metaworld_mt10_sft.yaml writes <root>/checkpoints/last.ckpt, and
    configs/vla_metaworld_mt10.yaml starts from it: the RL run's policy begins as the SFT policy and,
    during the critic warm-up, only the value head moves."""
    import torch
    import yaml

    from fastlight.data.demos import DemoDataModule
    from fastlight.modules.sft_module import VLASFTModule
    from fastlight.modules.vla_module import VLAModule

    sft_config, rl_config = SFT_CONFIGS[0], os.path.join(ROOT, "configs", "vla_metaworld_mt10.yaml")
    sft_spec, rl_spec = (yaml.safe_load(open(c)) for c in (sft_config, rl_config))
    # The demonstrations show what RL will see: same env and policy blocks.
    assert sft_spec["data"]["init_args"]["env_kwargs"] == rl_spec["data"]["init_args"]["env_kwargs"]
    assert sft_spec["model"]["init_args"]["policy"] == rl_spec["model"]["init_args"]["policy"]
    sft_root, rl_root = tmp_path / "sft", tmp_path / "rl"
    sft = cli_main([
        "fit", "--config", sft_config, "--data.demos_per_task", "1", "--data.num_workers", "0",
        "--data.max_attempts_per_demo", "1", "--data.successful_only", "false",
        "--data.env_kwargs.max_path_length", "5", "--data.cache_dir", str(tmp_path / "cache"),
        "--trainer.max_steps", "3", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(sft_root),
    ])  # fmt: skip
    assert type(sft.model) is VLASFTModule and type(sft.datamodule) is DemoDataModule
    assert sft.trainer.global_step == 3 and sft.datamodule.demos.num_episodes == 10
    ckpt = sft_root / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    sft_weights = {
        k: v for k, v in torch.load(ckpt, weights_only=False)["state_dict"].items() if k.startswith("policy.")
    }
    rl = cli_main([
        "fit", "--config", rl_config, *tiny_overrides(), "--data.env_kwargs.max_path_length", "5",
        "--model.init_from", str(ckpt), "--trainer.default_root_dir", str(rl_root),
    ])  # fmt: skip
    assert type(rl.model) is VLAModule and rl.model.policy_version == 1
    assert rl.model.hparams.value_warmup_updates >= 1  # so the one update below trained the critic only
    after = {f"policy.{k}": v for k, v in rl.model.policy.state_dict().items()}
    assert after.keys() == sft_weights.keys()
    moved = sorted(k for k in after if not torch.equal(after[k], sft_weights[k]))
    assert moved and all(k.startswith("policy.value_head.") for k in moved), moved
    assert (rl_root / "checkpoints" / "last.ckpt").is_file()
