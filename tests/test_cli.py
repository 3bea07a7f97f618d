"""`fastlight` CLI: every config and callback fragment parses and runs one tiny step."""

from __future__ import annotations

import glob
import importlib
import os
import subprocess
import sys

import pytest

from fastlight.callbacks.throughput import RolloutThroughput
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


def setting(obj: object, key: str) -> object:
    """``obj``'s value of constructor argument ``key``, as a YAML writes it (Lightning's
    ModelCheckpoint keeps some privately, e.g. ``_train_time_interval``, as a ``timedelta``)."""
    import datetime

    value = getattr(obj, key) if hasattr(obj, key) else getattr(obj, f"_{key}")
    return str(value) if isinstance(value, datetime.timedelta) else value


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
        if key == "objective":  # a class too: that objective was built, with the config's init_args
            assert type(cli.model.objective) is resolve(value["class_path"])
            for name, arg in value.get("init_args", {}).items():
                assert getattr(cli.model.objective, name) == arg, (key, name)
            continue
        if key == "init_from":
            continue
        assert cli.model.hparams[key] == value, key
    data = {k: v for k, v in spec["data"]["init_args"].items() if k not in overridden("data")}
    assert data, "the config sets nothing but what the test overrides"
    for key, value in data.items():
        if key in ("inference", "faults") and isinstance(value, dict):  # settings: the fields it writes
            hp_value = cli.datamodule.hparams[key]
            assert hp_value is not None and {k: hp_value[k] for k in value} == value, key
            continue
        assert cli.datamodule.hparams[key] == value, key
    assert cli.config.fit.seed_everything == spec["seed_everything"]
    assert cli.trainer.log_every_n_steps == spec["trainer"]["log_every_n_steps"]
    # ... and its callbacks, with their arguments.
    attached = {type(c): c for c in cli.trainer.callbacks}
    for cb in spec["trainer"]["callbacks"]:
        cls = resolve(cb["class_path"])
        assert cls in attached, cb["class_path"]
        for key, value in cb.get("init_args", {}).items():
            assert setting(attached[cls], key) == value, (cb["class_path"], key)
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


def no_init(spec: dict) -> list[str]:
    """A config that starts from another run's checkpoint runs here from scratch (the chain itself
    is test_vla_sft_then_rl_chain)."""
    return ["--model.init_from", "null"] if "init_from" in spec["model"]["init_args"] else []


@pytest.mark.multiproc
@pytest.mark.parametrize("config", RL_CONFIGS, ids=os.path.basename)
@pytest.mark.parametrize("fragment", FRAGMENTS, ids=os.path.basename)
def test_fragment_attaches_to_every_config(fragment, config, tmp_path):
    """Every fragment on every RolloutDataModule config: one callback of its class (the config's own,
    updated, when it has one), sized from the run; DWR on a single-task env is refused by name."""
    import yaml

    from fastlight.callbacks.dwr import DynamicWeightedResampling
    from fastlight.callbacks.preemption import PreemptionCheckpoint

    spec, frag = (yaml.safe_load(open(f)) for f in (config, fragment))
    (added,) = frag["trainer"]["callbacks+"]
    cls = resolve(added["class_path"])
    cli = cli_main(
        ["--config", config, "--config", fragment, *tiny_overrides(), *no_init(spec),
         "--trainer.default_root_dir", str(tmp_path)],
        run=False,
    )  # fmt: skip
    for path in {c["class_path"] for c in spec["trainer"]["callbacks"]} | {added["class_path"]}:
        assert sum(type(c) is resolve(path) for c in cli.trainer.callbacks) == 1, path  # never two
    (attached,) = [c for c in cli.trainer.callbacks if type(c) is cls]
    for own in (c for c in spec["trainer"]["callbacks"] if c["class_path"] == added["class_path"]):
        for key, value in own.get("init_args", {}).items():  # the config's settings survive the fragment
            assert getattr(attached, key) == value, key
    if cls is PreemptionCheckpoint and "vla" in os.path.basename(config):
        return  # attached as above; the CLI adds it to every run, so test_config_runs_one_step runs it there
    if cls is DynamicWeightedResampling and cli.datamodule.task_names is None:
        match = f"--data.env_id {cli.datamodule.hparams.env_id} has no tasks"
        with pytest.raises(TypeError, match=match):  # at setup, before any sampler starts
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        return
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.model.policy_version == 1
    if cls is DynamicWeightedResampling:  # sized from the env: MT10 has 10 tasks, reach-v3 one
        assert attached.num_tasks == len(cli.datamodule.task_names) == len(attached.task_names)
        weights = [k for k in cli.trainer.callback_metrics if k.startswith("dwr/weight_")]
        assert len(weights) == attached.num_tasks
    elif isinstance(attached, RolloutThroughput):
        assert attached.totals["raw_steps"] >= attached.totals["valid_steps"] > 0


def test_repeated_callbacks_merge_into_the_first():
    from jsonargparse import Namespace

    from fastlight.cli_callbacks import merge_repeated_callbacks

    dwr = "fastlight.callbacks.dwr.DynamicWeightedResampling"
    tput = "fastlight.callbacks.throughput.RolloutThroughput"
    ckpt = "lightning.pytorch.callbacks.ModelCheckpoint"
    merged = merge_repeated_callbacks([
        Namespace(class_path=dwr, init_args=Namespace(num_tasks=None, window=20, eps=0.2, task_names=None)),
        Namespace(class_path=ckpt, init_args=Namespace(monitor="a")),
        Namespace(class_path=tput),
        Namespace(class_path=ckpt, init_args=Namespace(monitor="b")),  # two monitors: both kept
        # a fragment's entry, defaults filled in by the parser: only non-defaults update the first
        Namespace(class_path=dwr, init_args=Namespace(num_tasks=None, window=100, eps=0.5, task_names=None)),
        Namespace(class_path=tput, init_args=Namespace(window=4, prog_bar=True)),
    ])  # fmt: skip
    assert [c.class_path for c in merged] == [dwr, ckpt, tput, ckpt]
    assert vars(merged[0].init_args) == {"num_tasks": None, "window": 20, "eps": 0.5, "task_names": None}
    assert vars(merged[2].init_args) == {"window": 4}
    assert [c.init_args.monitor for c in merged if c.class_path == ckpt] == ["a", "b"]


def test_short_callback_name_resolves_to_fastlights_throughput(tmp_path):
    """``--trainer.callbacks+=RolloutThroughput`` is fastlight's callback (``ThroughputMonitor`` was
    Lightning's), also on a config that does not name it, and stays one on a config that has it."""
    from fastlight.callbacks.throughput import RolloutThroughput

    for config in ("examples/merge.yaml", "configs/highway_dpsa.yaml"):
        cli = cli_main(
            ["--config", os.path.join(ROOT, config), "--trainer.callbacks+=RolloutThroughput",
             *tiny_overrides(), "--trainer.default_root_dir", str(tmp_path)],
            run=False,
        )  # fmt: skip
        assert [type(c) for c in cli.trainer.callbacks].count(RolloutThroughput) == 1, config


def test_old_short_name_stays_lightnings_and_is_not_ambiguous(tmp_path):
    """In a fresh process, as the command runs, the bare name ``ThroughputMonitor`` is Lightning's FLOPs
    monitor, the name's owner: fastlight defines no class of that name to make it ambiguous."""
    code = (
        "import sys; from fastlight.cli import cli_main; "
        "cli = cli_main(sys.argv[1:], run=False); "
        "print([f'{type(c).__module__}.{type(c).__name__}' for c in cli.trainer.callbacks])"
    )
    args = ["--config", os.path.join(ROOT, "examples", "merge.yaml"), *tiny_overrides(),
            "--trainer.callbacks+=ThroughputMonitor", "--trainer.callbacks.batch_size_fn=builtins.len",
            "--trainer.default_root_dir", str(tmp_path)]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=180
    )
    assert out.returncode == 0, out.stderr
    assert "lightning.pytorch.callbacks.throughput_monitor.ThroughputMonitor" in out.stdout
    assert "fastlight.callbacks.throughput" not in out.stdout  # (PreemptionCheckpoint is a CLI default)


def test_global_seed_reaches_the_envs_unless_data_seed_is_set(tmp_path, monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # restored after the test
    base = ["--config", os.path.join(ROOT, "configs", "highway_dpsa.yaml"), *tiny_overrides(),
            "--trainer.default_root_dir", str(tmp_path)]  # fmt: skip
    for extra, env_seed in ((["--seed_everything", "5"], 5), (["--seed_everything", "6"], 6),
                            (["--seed_everything", "6", "--data.seed", "2"], 2)):  # fmt: skip
        cli = cli_main([*base, *extra], run=False)
        assert cli.datamodule.hparams.seed == (2 if "--data.seed" in extra else None)
        assert cli.datamodule.sampler_configs(0)[0].seed == env_seed, extra


def test_cli_hides_third_party_tips_and_known_warnings(tmp_path, capfd, caplog):
    import warnings

    import torch.utils._pytree

    cli = cli_main(
        ["--config", os.path.join(ROOT, "configs", "highway_dpsa.yaml"), *tiny_overrides(),
         "--trainer.default_root_dir", str(tmp_path)],
        run=False,
    )  # fmt: skip
    assert cli.trainer.loggers  # the Trainer (whose logger set-up prints Lightning's litlogger tip) exists
    out, err = capfd.readouterr()
    assert "Tip" not in out + err + caplog.text
    with warnings.catch_warnings(record=True) as caught:
        torch.utils._pytree.LeafSpec()  # what Lightning's _pytree does on every step
    assert not [w for w in caught if "LeafSpec" in str(w.message)]
    # Lightning's resume warning about a non-resumable dataloader means nothing for an RL stream.
    from lightning.fabric.utilities.warnings import PossibleUserWarning
    from lightning.pytorch.utilities import rank_zero_warn

    with warnings.catch_warnings(record=True) as caught:
        rank_zero_warn(
            "You're resuming from a checkpoint that ended before the epoch ended and your dataloader is"
            " not resumable. This can cause unreliable results if further training is done.",
            category=PossibleUserWarning,
        )
        rank_zero_warn("another warning stays", category=PossibleUserWarning)
    assert [str(w.message) for w in caught] == ["another warning stays"]


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
        "class_path: fastlight.RLModule",  # the public name (fastlight exports it)
        "gae_lambda: 0.95",
        "max_staleness: 0",
    ):
        assert key in out.stdout, key


def run_cli(*args: str, debug: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "FASTLIGHT_DEBUG": "1" if debug else "0"}
    config = os.path.join(ROOT, "configs", "highway_dpsa.yaml")
    return subprocess.run(
        [sys.executable, "-m", "fastlight.cli", "fit", "--config", config, *args, "--trainer.max_steps", "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=180, env=env,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("--data.termination_threshold", "1.5"),
            "--data.termination_threshold must be in [0, 1] or auto, got 1.5",
        ),
        pytest.param(  # a value its type refuses: jsonargparse's report; test_cli_errors has more
            ("--data.reset_mode", "foo"),
            """Parser key "data": Parser key "reset_mode": Expected a typing.Literal['dpsa', 'sgr', """
            """'autoreset', 'sequential']. Got value: foo""",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_cli_error_is_one_line_naming_the_flag(args, line):
    out = run_cli(*args)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    errors = [x for x in out.stderr.splitlines() if "error" in x.lower()]
    assert errors == [f"fastlight: error: {line}  (FASTLIGHT_DEBUG=1 shows the traceback)"], out.stderr


def test_fastlight_debug_shows_the_traceback():
    out = run_cli("--data.termination_threshold", "1.5", debug=True)
    assert out.returncode == 1
    assert "Traceback" in out.stderr
    assert "ValueError: --data.termination_threshold must be in [0, 1] or auto, got 1.5" in out.stderr


def objective_cli(tmp_path, *args: str) -> object:
    config = os.path.join(ROOT, "configs", "highway_dpsa.yaml")
    return cli_main(["--config", config, *args, "--trainer.default_root_dir", str(tmp_path)], run=False)


def test_objective_is_a_class_with_its_own_settings(tmp_path):
    from fastlight.modules.objectives import GIPO, SAPO, PPOClip

    assert objective_cli(tmp_path).model.objective == PPOClip(clip_eps=0.2)  # the default
    cli = objective_cli(tmp_path, "--model.objective", "GIPO", "--model.objective.sigma", "0.2")
    assert cli.model.objective == GIPO(sigma=0.2)
    assert cli.model.hparams.objective == {
        "class_path": "fastlight.GIPO",  # the public name, as the CLI records it
        "init_args": {"sigma": 0.2, "clip_frac_eps": 0.2},
    }
    yaml_config = tmp_path / "sapo.yaml"
    yaml_config.write_text(
        "model:\n  init_args:\n    objective:\n      class_path: fastlight.modules.objectives.SAPO\n"
        "      init_args: {tau_neg: 2.0}\n"
    )
    assert objective_cli(tmp_path, "--config", str(yaml_config)).model.objective == SAPO(tau_neg=2.0)


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (("PPOClip", "--model.objective.sigma", "0.2"), "Option 'sigma' is not accepted"),
        (("GIPO", "--model.objective.clip_eps", "0.1"), "Option 'clip_eps' is not accepted"),
        (("SAPO", "--model.objective.sigma", "0.1"), "Option 'sigma' is not accepted"),
    ],
)
def test_a_setting_of_another_objective_is_refused(tmp_path, args, refused):
    with pytest.raises(ValueError) as error:
        objective_cli(tmp_path, "--model.objective", *args)
    assert str(error.value) == f'Parser key "model": Parser key "objective": {refused}'


#: Settings of the old objective interface (gone before any release): refused like any unknown key, on
#: the command line and in a config file.
OLD_OBJECTIVE = [
    (("--model.objective", "gipo"), 'Parser key "objective": Expected a dot import path string: gipo'),
    (("--model.gipo_sigma", "0.2"), "Option 'gipo_sigma' is not accepted"),
    (("--model.clip_eps", "0.1"), "Option 'clip_eps' is not accepted"),
]


@pytest.mark.parametrize(("args", "line"), OLD_OBJECTIVE)
def test_old_objective_settings_are_refused_naming_them(tmp_path, args, line):
    with pytest.raises(ValueError) as error:
        objective_cli(tmp_path, *args)
    assert str(error.value) == f'Parser key "model": {line}'
    old_yaml = tmp_path / "old.yaml"  # the same in a config file
    key, value = args[0].removeprefix("--model."), args[1]
    old_yaml.write_text(f"model:\n  init_args:\n    {key}: {value}\n")
    with pytest.raises(ValueError) as error:
        objective_cli(tmp_path, "--config", str(old_yaml))
    assert line in str(error.value) and "\n" not in str(error.value)


@pytest.mark.multiproc
def test_vla_sft_then_rl_chain(tmp_path):
    """configs/vla_metaworld_mt10_sft.yaml writes <root>/checkpoints/last.ckpt, and
    configs/vla_metaworld_mt10.yaml starts from it: the RL run's policy begins as the SFT policy and,
    during the critic warm-up, only the value head moves."""
    import torch
    import yaml

    from fastlight.vla.demos import DemoDataModule
    from fastlight.vla.module import VLAModule
    from fastlight.vla.sft import VLASFTModule

    sft_config, rl_config = SFT_CONFIGS[0], os.path.join(ROOT, "configs", "vla_metaworld_mt10.yaml")
    sft_spec, rl_spec = (yaml.safe_load(open(c)) for c in (sft_config, rl_config))
    # The demonstrations show what RL will see: same env and policy blocks (RL samples at its own
    # temperature, which is no weight).
    assert sft_spec["data"]["init_args"]["env_kwargs"] == rl_spec["data"]["init_args"]["env_kwargs"]
    rl_policy = rl_spec["model"]["init_args"]["policy"]
    assert rl_policy["init_args"].pop("temperature") < 1.0
    assert sft_spec["model"]["init_args"]["policy"] == rl_policy
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


@pytest.mark.multiproc
def test_resume_does_not_read_init_from(tmp_path, capsys):
    """--ckpt_path resumes a run started with --model.init_from even once that file is gone: the
    checkpoint holds the weights, and one line says init_from was not read."""
    import torch

    config = os.path.join(ROOT, "configs", "highway_dpsa.yaml")
    start = tmp_path / "start"
    cli_main(["fit", "--config", config, *tiny_overrides(), "--trainer.default_root_dir", str(start)])
    init = tmp_path / "init.ckpt"
    os.replace(start / "checkpoints" / "last.ckpt", init)
    run = tmp_path / "run"
    args = ["fit", "--config", config, *tiny_overrides(), "--trainer.default_root_dir", str(run)]
    cli_main([*args, "--model.init_from", str(init)])
    last = run / "checkpoints" / "last.ckpt"
    step = torch.load(last, weights_only=False)["global_step"]
    os.remove(init)  # the SFT / earlier run's file moved away since
    capsys.readouterr()
    resumed = cli_main([*args, "--model.init_from", str(init), "--ckpt_path", str(last),
                        "--trainer.max_steps", str(2 * step)])  # fmt: skip
    assert resumed.trainer.global_step == 2 * step and resumed.model.policy_version == 2
    err = capsys.readouterr().err
    assert f"--model.init_from {init} is not read (the checkpoint holds the weights)" in err
    assert "(yours apply)" not in err  # init_from is no setting that differs


def test_two_spellings_of_one_callback_merge_into_one():
    # jsonargparse records fastlight's public name (fastlight.X); an older config spells the module.
    from jsonargparse import Namespace

    from fastlight.cli_callbacks import merge_repeated_callbacks

    full = "fastlight.callbacks.throughput.RolloutThroughput"
    merged = merge_repeated_callbacks([
        Namespace(class_path="fastlight.RolloutThroughput", init_args=Namespace(window=4)),
        Namespace(class_path=full, init_args=Namespace(window=8)),
    ])  # fmt: skip
    assert len(merged) == 1 and merged[0]["init_args"]["window"] == 8


def test_a_resume_mismatch_names_only_the_nested_settings_that_differ():
    """A resume whose policy folder differs: one short item naming that flag, not two dumped dicts."""
    from jsonargparse import Namespace

    from fastlight.cli import _differences

    old = {"backbone": "/old", "n_bins": 256, "lora": None}
    saved_policy = {"class_path": "fastlight.VLAPolicy", "init_args": old}
    saved = {"_class_path": "fastlight.VLAModule", "policy": saved_policy, "lr": 1e-4}
    new = Namespace(backbone="/new", n_bins=256, lora=None)
    policy = Namespace(class_path="fastlight.VLAPolicy", init_args=new)
    typed = Namespace(class_path="fastlight.VLAModule", init_args=Namespace(policy=policy, lr=1e-4))
    assert _differences(saved, typed) == ["--model.policy.init_args.backbone /new (checkpoint: /old)"]
