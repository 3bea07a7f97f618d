"""Every command-line mistake of ``fastlight fit`` is one line on stderr, and exit status 2.

Each case checks the whole of stderr: exactly one non-empty line, ``fastlight: error: `` and the message
of whoever refused it, as they worded it (a constructor's names the flag). The cases that reach past the
parser (a file a flag names, the env's keywords, the forkserver warm-up of the console script) run the
real console script (``fastlight``, the one the venv installs) from the repo root, as a user would, a few
at a time (each is mostly Lightning's import). The parser's own mistakes run ``fastlight.cli.main`` in
this process, the function the console script calls after its warm-up, with ``sys.argv`` set as the shell
would: the same code path, without paying Lightning's import once per case.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FASTLIGHT = Path(sys.executable).parent / "fastlight"
CONFIG = "configs/highway_dpsa.yaml"
SUFFIX = "  (FASTLIGHT_DEBUG=1 shows the traceback)"
BAD_YAML = "model:\n  lr: 1\n   bad: 2\n"
OPTIMIZER = (
    "--optimizer is not a setting: the module makes its optimizer (fastlight.RLModule: Adam at --model.lr "
    "over param_groups()); set --model.lr, or override param_groups() (which parameters, a learning rate "
    "per group) or configure_optimizers() (another optimizer, a scheduler) in a subclass"
)


#: (id, arguments after the common ones, the whole error line; {tmp} is the run's folder). A value the
#: types allow is refused by its constructor, naming the flag; one they do not allow, or a key no class
#: has, is jsonargparse's own report (each nested key's line, then the check that failed); a Trainer
#: argument is Lightning's own check.
MISTAKES: list[tuple[str, tuple[str, ...], str]] = [
    (
        "unknown-model-setting",
        ("--model.learning_rate", "1e-3"),
        """Parser key "model": Option 'learning_rate' is not accepted""",
    ),
    (
        "unknown-trainer-setting",
        ("--trainer.max_stpes", "2"),
        "unrecognized arguments: --trainer.max_stpes 2 (did you mean trainer.max_steps?)",
    ),
    (
        "misspelled-data-setting",
        ("--data.termination_treshold", "0.5"),
        """Parser key "data": Option 'termination_treshold' is not accepted (did you mean """
        "termination_threshold?)",
    ),
    (
        "wrong-type",
        ("--data.num_envs", "four"),
        """Parser key "data": Parser key "num_envs": Expected a <class 'int'>. Got value: four""",
    ),
    (
        "constructor",
        ("--data.termination_threshold", "1.5"),
        "--data.termination_threshold must be in [0, 1] or auto, got 1.5",
    ),
    (
        "group-size",
        ("--data.group_size", "3"),
        "--data.group_size 3 must divide each sampler's envs (--data.num_envs 2 / --data.num_workers 1) with "
        "--data.reset_mode dpsa or sgr (got dpsa)",
    ),
    ("missing-config", ("--config", "configs/nope.yaml"), "--config configs/nope.yaml: no such file"),
    (
        "bad-yaml",
        ("--config", "{tmp}/bad.yaml"),
        "--config {tmp}/bad.yaml: line 3, column 7: mapping values are not allowed here",
    ),
    (
        "binary-config",
        ("--config", "{tmp}/binary.yaml"),
        "--config {tmp}/binary.yaml: not a YAML file (not UTF-8 text: byte 0)",
    ),
    ("missing-ckpt", ("--ckpt_path", "{tmp}/x.ckpt"), "--ckpt_path: no checkpoint file at {tmp}/x.ckpt"),
    (
        "missing-init-from",
        ("--model.init_from", "{tmp}/nope.ckpt"),
        "--model.init_from: no checkpoint file at {tmp}/nope.ckpt",
    ),
    (
        "trainer-max-time",
        ("--trainer.max_time", "2min"),
        "`Timer(duration='2min')` is not a valid duration. Expected a string in the format DD:HH:MM:SS.",
    ),
    (
        "trainer-max-steps",
        ("--trainer.max_steps", "-5"),
        "`max_steps` must be a non-negative integer or -1 (infinite steps). You passed in -5.",
    ),
    ("optimizer", ("--optimizer", "AdamW"), OPTIMIZER),
    (
        "negative-value",
        ("--model.lr", "-1e-3"),
        "--model.lr must be > 0, got -0.001",
    ),  # not "expected one argument"
    (
        "fsdp1-on-a-cpu",  # refused before Lightning's own GPU-only check and its traceback
        ("--trainer.strategy", "fsdp"),
        "--trainer.strategy fsdp (FSDP1) cannot run fastlight's update: it wraps the LightningModule in one "
        "root unit whose forward is training_step, and refuses the several backward passes an update makes "
        "inside it; use --trainer.strategy fsdp2 (FSDP2, Lightning's ModelParallelStrategy: the policy's "
        "blocks are sharded one by one)",
    ),
    (
        "seed",
        ("--seed_everything", "abc"),
        """Parser key "seed_everything": Expected a <class 'bool'>. Got value: abc""",
    ),
    (
        "callback",
        ("--trainer.callbacks+=NoSuchCallback",),
        """Parser key "trainer.callbacks": Expected a dot import path string: NoSuchCallback""",
    ),
    (
        "env-kwargs",
        ("--data.env_kwargs", '{"bogus_key": 1}'),
        "--data.env_kwargs: AbstractEnv.__init__() got an unexpected keyword argument 'bogus_key' was "
        "raised from the environment creator for highway-fast-v0 with kwargs ({'bogus_key': 1})",
    ),
]
DEBUG = ("debug", *MISTAKES[2][1:])
#: The cases run as a user's command does, with the forkserver warm-up that reads the config files first
#: (fastlight.__main__). The others pass --data.start_method spawn, which skips it: it is seconds of CPU
#: in one more process per run, and none of their mistakes goes near it.
WARM = ("missing-config", "bad-yaml", "env-kwargs")
#: The cases that run as a subprocess of the console script (the rest run in this process): those that get
#: past the parser (the Trainer's own checks print after Lightning's logging is set up).
SUBPROCESS = (*WARM, "missing-ckpt", "missing-init-from", "trainer-max-time", "trainer-max-steps",
              "negative-value", "fsdp1-on-a-cpu")  # fmt: skip
#: Subprocess cases that only repeat a path another case takes (a second warm-up reading, a second
#: missing file, a second Trainer check): ``slow``, so that ``make test`` launches five commands here.
SLOW = ("env-kwargs", "missing-init-from", "trainer-max-steps")


Run = subprocess.CompletedProcess


def expand(text: str, tmp: Path) -> str:
    """``text`` with the run's folder for ``{tmp}``."""
    return text.replace("{tmp}", str(tmp))


def fit(tmp: Path, args: tuple[str, ...], *, debug: bool = False, warm: bool = False) -> Run:
    env = {k: v for k, v in os.environ.items() if k != "FASTLIGHT_DEBUG"}
    if debug:
        env["FASTLIGHT_DEBUG"] = "1"
    common = ("--config", CONFIG, "--trainer.max_steps", "1", "--data.num_workers", "1", "--data.num_envs")
    root = ("--trainer.default_root_dir", str(tmp), *(() if warm else ("--data.start_method", "spawn")))
    return subprocess.run(
        [str(FASTLIGHT), "fit", *common, "2", *root, *(expand(a, tmp) for a in args)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict[str, tuple[Path, Run]]:
    """The selected subprocess cases' runs, a few at a time (run together, whichever test asks first)."""
    selected = {
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_a_mistake_is_one_line_naming_the_flag"
    }
    cases = [(*case, False) for case in MISTAKES if case[0] in SUBPROCESS and case[0] in selected]
    cases.append((*DEBUG, True))

    def one(case: tuple[str, tuple[str, ...], str, bool]) -> tuple[str, tuple[Path, Run]]:
        name, args, _line, debug = case
        tmp = tmp_path_factory.mktemp(name)
        (tmp / "bad.yaml").write_text(BAD_YAML)
        return name, (tmp, fit(tmp, args, debug=debug, warm=name in WARM))

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, cases))


def fit_in_process(tmp: Path, args: tuple[str, ...], monkeypatch, capsys) -> Run:
    """``fastlight fit ...`` through ``fastlight.cli.main`` here, as the console script calls it."""
    from fastlight.cli import main

    monkeypatch.delenv("FASTLIGHT_DEBUG", raising=False)
    monkeypatch.chdir(ROOT)
    common = ("--config", CONFIG, "--trainer.max_steps", "1", "--data.num_workers", "1", "--data.num_envs")
    argv = ["fastlight", "fit", *common, "2", "--trainer.default_root_dir", str(tmp),
            "--data.start_method", "spawn", *(expand(a, tmp) for a in args)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main()
    out = capsys.readouterr()
    return Run(argv, int(info.value.code), out.out, out.err)


@pytest.mark.parametrize(
    ("name", "args", "line"),
    [pytest.param(*m, marks=pytest.mark.slow) if m[0] in SLOW else m for m in MISTAKES],
    ids=[m[0] for m in MISTAKES],
)
def test_a_mistake_is_one_line_naming_the_flag(runs, name, args, line, tmp_path, monkeypatch, capsys):
    if name in SUBPROCESS:
        tmp, out = runs[name]
    else:
        (tmp_path / "binary.yaml").write_bytes(bytes([0x91, 0xFF, 0x00, 0x12]) * 64)
        tmp, out = tmp_path, fit_in_process(tmp_path, args, monkeypatch, capsys)
    errors = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2, out.stderr
    assert errors == [f"fastlight: error: {expand(line, tmp)}{SUFFIX}"], out.stderr


def test_fastlight_debug_shows_the_traceback(runs):
    _tmp, out = runs["debug"]
    assert out.returncode == 1, out.stderr
    assert "Traceback (most recent call last)" in out.stderr
    assert f"SettingError: {DEBUG[2]}" in out.stderr
    assert "fastlight: error:" not in out.stderr


def test_print_config_has_no_optimizer_arguments(capsys):
    from fastlight.cli import cli_main

    with pytest.raises(SystemExit) as info:
        cli_main(["fit", "--config", str(ROOT / CONFIG), "--print_config"])
    assert info.value.code == 0
    printed = capsys.readouterr().out
    assert "\nmodel:\n" in printed and "\ntrainer:\n" in printed  # the config was printed
    assert "optimizer" not in printed and "lr_scheduler" not in printed


def test_no_seed_line_comes_before_a_mistake(monkeypatch):
    """A mistake found while the classes are built must not follow Lightning's "Seed set to N" (the seed
    is in the run's config.yaml); Lightning's other lines still print. Its loggers are set up as in the
    command (its own handlers; pytest's root handlers would take them over here)."""
    from lightning.fabric.utilities.seed import seed_everything
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    from fastlight.cli_output import quiet_third_party

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    for name in ("lightning.fabric", "lightning.pytorch"):
        monkeypatch.setattr(logging.getLogger(name), "handlers", [handler])
        monkeypatch.setattr(logging.getLogger(name), "propagate", False)
    seed_log = logging.getLogger("lightning.fabric.utilities.seed")
    level = seed_log.level
    try:
        seed_log.setLevel(logging.NOTSET)
        quiet_third_party()
        seed_everything(7)
        rank_zero_info("GPU available: False, used: False")
    finally:
        seed_log.setLevel(level)
    assert stream.getvalue().splitlines() == ["GPU available: False, used: False"]
