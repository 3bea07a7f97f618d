"""``fastlight`` command line: LightningCLI in omegaconf mode, with subclass modes.

    fastlight fit --config configs/highway_dpsa.yaml
    fastlight fit --config configs/highway_dpsa.yaml --trainer.max_steps 3
    fastlight fit --config configs/highway_dpsa.yaml --print_config

Constructor signatures are the schema. The env's observation and action sizes are linked from the
DataModule to the model, so a config never repeats them (an injected ``--model.policy`` carries its
own, checked against the env before any sampler starts).
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import lightning as L
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO

# Imported so that their short names resolve on the command line (--model.help VLAModule, --data
# DemoDataModule): jsonargparse resolves a bare class name among the subclasses already imported.
import fastlight.data.datamodule  # noqa: F401
import fastlight.vla.demos  # noqa: F401
import fastlight.vla.module  # noqa: F401
import fastlight.vla.sft  # noqa: F401
from fastlight.callbacks.preemption import Preempted, PreemptionCheckpoint, stop_reported
from fastlight.checkpoints import AtomicCheckpointIO, check_writable_dir
from fastlight.class_paths import same_class
from fastlight.cli_defaults import complete_run_config, forget_run_folders, resume_last, root_dir
from fastlight.cli_output import (
    SettingError,
    debug_enabled,
    one_line_errors,
    quiet_third_party,
    setting_error_line,
)
from fastlight.cli_parser import (
    FastlightArgumentParser,
    check_command_line,
    check_init_from,
    note_nested_help,
)
from fastlight.data.datamodule import RolloutDataModule
from fastlight.data.protocols import ChecksEnvSpec
from fastlight.log_writes import guard_logger_writes
from fastlight.models.spaces import policy_notice
from fastlight.modules.rl_module import RLModule
from fastlight.modules.sharding import refuse_fsdp1
from fastlight.modules.weights_fit import differences
from fastlight.procs import ignore_stop_signals
from fastlight.ranks import peer_watch

#: Model arguments the CLI links from the data module: not the user's to set, never a difference.
_LINKED = ("obs_dim", "action_dim", "continuous", "spaces")


#: ``fastlight fit --help``: where fastlight's settings are among Lightning's many.
FIT_USAGE = "%(prog)s [--config FILE ...] [--print_config] [--trainer.* ...] [--model.* ...] [--data.* ...]"
FIT_HELP = (
    "Train fastlight's --model on its --data (Lightning's Trainer.fit). fastlight's settings are the "
    "--model.* and --data.* groups at the end of this help; `--model.help RLModule` and `--data.help "
    "RolloutDataModule` print one class's alone, `--print_config` every value of a config, README.md what "
    "each one is for."
)
#: The --model and --data groups' descriptions (Lightning's base classes' docstrings otherwise).
GROUP_HELP = {
    "model": "fastlight's RL module (--model.class_path fastlight.RLModule, fastlight.VLAModule or your "
    "subclass): the policy (--model.policy), the objective (--model.objective: PPOClip, GIPO or SAPO), the "
    "PPO/GAE settings and the learning rate; the env's sizes are linked from --data.",
    "data": "fastlight's data module (--data.class_path fastlight.RolloutDataModule; DemoDataModule for "
    "SFT): the env (--data.env_id, env_kwargs, env_wrappers), its samplers (--data.num_envs, num_workers, "
    "fleet) and DPSA's resets (--data.reset_mode, termination_threshold, max_horizon).",
}


class FastlightCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:  # noqa: ANN001 - jsonargparse parser
        for key in _LINKED:
            parser.link_arguments(f"data.{key}", f"model.init_args.{key}", apply_on="instantiate")
        for key, text in GROUP_HELP.items():
            parser.groups[key].description = text

    def before_instantiate_classes(self) -> None:
        """The command's callbacks, loggers and per-run folders (:mod:`fastlight.cli_defaults`, which
        ``--print_config`` shows too)."""
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        # Before any sampler starts: the first write there (TensorBoard's) would fail much later.
        check_writable_dir(root_dir(cfg), flag="--trainer.default_root_dir")
        if self.subcommand:
            self.config[self.subcommand] = complete_run_config(cfg)
        else:
            self.config = complete_run_config(cfg)
        # Each run writes its own version folder, a resumed one too: ModelCheckpoint's note is moot.
        warnings.filterwarnings("ignore", message="The dirpath has changed from .* won't be reloaded")

    def after_instantiate_classes(self) -> None:
        """An injected policy meets the env before the fit wraps anything around it: a VLA on an env without
        instructions is refused naming what the env lacks, not in configure_optimizers' AttributeError."""
        model, data = self.model, self.datamodule
        injected = isinstance(model, ChecksEnvSpec) and model.hparams.get("policy") is not None
        if injected and isinstance(data, RolloutDataModule):
            model.check_env_spec(data.env_spec)
        # Which default policy the env's spaces got (an image's CNN, a Dict's parts), said once.
        default = isinstance(model, RLModule) and type(model).build_policy is RLModule.build_policy
        if default and model.hparams.get("policy") is None and self.trainer.global_rank == 0:
            print(f"fastlight: policy {policy_notice(model.hparams.get('spaces'), model.hparams.obs_dim)}")

    def parse_arguments(self, parser, args) -> None:  # noqa: ANN001 - jsonargparse parser and args
        """LightningCLI's parsing, every refusal one line (:mod:`fastlight.cli_parser`), a missing
        ``--model.init_from`` file before the data module and the Trainer start."""
        argv = sys.argv[1:] if args is None else args
        if isinstance(argv, list | tuple):
            check_command_line(argv)
            note_nested_help(argv)
            if args is None:  # LightningCLI reads sys.argv itself (and warns when given both)
                sys.argv[1:] = joined_negative_values(argv)
            else:
                args = joined_negative_values(argv)
        super().parse_arguments(parser, args)
        self.config = forget_run_folders(self.config)  # a run's saved config.yaml starts a new version
        check_init_from(self.config)

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        """Atomic checkpoint files unless the user brings a CheckpointIO of their own; loggers whose failed
        write stops the run in one line (:mod:`fastlight.log_writes`)."""
        refuse_fsdp1(self._get(self.config_init, "trainer", default={}).get("strategy"))
        plugins = _listed(self._get(self.config_init, "trainer", default={}).get("plugins"))
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        trainer = super().instantiate_trainer(**kwargs)
        guard_logger_writes(trainer.loggers)  # a full disk under a logger: one line, not its tracebacks
        for cb in trainer.callbacks:
            if isinstance(cb, PreemptionCheckpoint):
                cb.resume_hint = "--ckpt_path {path}"  # this command's way to resume
                cb.refusal = setting_error_line  # a refused setting: its `fastlight: error:` line alone
        # Lightning stops at the first batch (rollout, several optimizer steps) at or past max_steps.
        per = self.model.optimizer_steps_per_update if isinstance(self.model, RLModule) else 1
        if trainer.max_steps > 0 and trainer.max_steps % per and trainer.global_rank == 0:
            _note(
                f"--trainer.max_steps {trainer.max_steps} counts optimizer steps, {per} per "
                "rollout (--model.update_epochs x --model.num_minibatches): training stops after the rollout "
                f"that reaches it, at step {-(-trainer.max_steps // per) * per}"
            )
        return trainer

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> L.Trainer:
        """A progress bar in RL units (:class:`~fastlight.callbacks.progress.RolloutProgressBar`) unless
        the user brings their own or turns it off (``--trainer.enable_progress_bar false``)."""
        from lightning.pytorch.callbacks import ProgressBar

        from fastlight.callbacks.progress import RolloutProgressBar

        defaults = self.trainer_defaults.get("callbacks")
        theirs = [*_listed(config.get("callbacks")), *callbacks, *_listed(defaults)]
        has_bar = any(isinstance(c, ProgressBar) for c in theirs)
        if config.get("enable_progress_bar") is not False and not has_bar:
            callbacks = [*callbacks, RolloutProgressBar()]
        return super()._instantiate_trainer(config, callbacks)

    def _parse_ckpt_path(self) -> None:
        """``--ckpt_path`` resumes with the settings the user typed (config + command line), where
        LightningCLI would overwrite them with the checkpoint's; one line lists those that differ. A
        missing, truncated or non-checkpoint file is refused naming the path; ``--model.init_from`` is
        not read (the checkpoint holds the weights)."""
        sub = self.config.get("subcommand")
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        if ckpt_path == "last":  # <root>/checkpoints/last.ckpt, read like any path given
            ckpt_path = self.config[sub]["ckpt_path"] = resume_last(self.config[sub])
        if not ckpt_path or ckpt_path in ("last", "best", "hpc", "registry"):
            return
        from fastlight.checkpoints import read_checkpoint

        checkpoint = read_checkpoint(ckpt_path, flag="--ckpt_path", sharded=True)
        saved = dict(checkpoint.get("hyper_parameters") or {})
        saved_data = dict(checkpoint.get("datamodule_hyper_parameters") or {})
        check_same_env(ckpt_path, saved_data.get("env_id"), self.config[sub].get("data"))
        model = self.config[sub].get("model")
        if model is None or getattr(model, "class_path", None) is None:
            return super()._parse_ckpt_path()  # nothing typed: rebuild the checkpoint's model
        init_args = model.get("init_args")
        init_from = init_args.get("init_from") if init_args is not None else None
        if init_from:  # moot (the checkpoint restores the weights), and fails on a file moved since
            init_args["init_from"] = None
            note = "is not read (the checkpoint holds the weights)"
            _note(f"resuming {ckpt_path}: --model.init_from {init_from} {note}")
        if diffs := _differences(saved, model, saved_data, self.config[sub].get("data")):
            _note(
                f"resuming {ckpt_path} with settings that differ from the checkpoint's "
                f"(yours apply): {'; '.join(diffs)}"
            )


def _note(line: str) -> None:
    print(f"fastlight: {line}", file=sys.stderr, flush=True)


def _listed(value: Any) -> list[Any]:
    """A setting that takes one object or a list of them, as a list."""
    return [] if value is None else list(value) if isinstance(value, list) else [value]


_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def joined_negative_values(argv: Sequence[str]) -> list[str]:
    """``--flag -1e-3`` as ``--flag=-1e-3``: argparse reads a value that starts with ``-`` as the next
    option ("expected one argument"), so a negative number is handed to its flag explicitly."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NUMBER.fullmatch(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def check_same_env(ckpt_path: str, theirs: str | None, data: Namespace | None) -> None:
    """A run resumes on the env its checkpoint was trained on (``--ckpt_path last`` in a root shared by
    runs of two envs is the usual way to ask otherwise unawares)."""
    init_args = data.get("init_args") if isinstance(data, Namespace) else None
    mine = init_args.get("env_id") if isinstance(init_args, Namespace) else None
    if not (isinstance(mine, str) and isinstance(theirs, str)):
        return
    if mine.rpartition(":")[2] != theirs.rpartition(":")[2]:  # `pkg:id` and `id` name one env
        raise SettingError(
            f"--ckpt_path {ckpt_path} was trained on {theirs}, not on this run's --data.env_id {mine}: "
            f"resume it with --data.env_id {theirs}, or give a run of {mine} a root of its own "
            "(--trainer.default_root_dir) so that `--ckpt_path last` finds its own checkpoints"
        )


def _differences(
    saved: dict[str, Any],
    model: Namespace,
    saved_data: dict[str, Any] | None = None,
    data: Namespace | None = None,
) -> list[str]:
    """``--model.<key> <yours> (checkpoint: <theirs>)`` for every setting both sides hold, then
    ``--data.<key> ...`` likewise between the DataModule's (``data``, as parsed) and the checkpoint's
    (``saved_data``, its ``datamodule_hyper_parameters``)."""
    out = []
    theirs_class = saved.get("_class_path")
    if theirs_class and not same_class(theirs_class, model.class_path):
        out.append(f"--model.class_path {model.class_path} (checkpoint: {theirs_class})")
    out += differences("--model.", model.get("init_args"), saved, skip=(*_LINKED, "init_from"))
    init_args = data.get("init_args") if isinstance(data, Namespace) else None
    return out + differences("--data.", init_args, saved_data or {})


def cli_main(args: list[str] | None = None, *, run: bool = True) -> FastlightCLI:
    os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo (Meta-World) renders without a display
    quiet_third_party()  # Lightning's tips and known-harmless warnings
    # Like `python -m`, resolve class paths of the project being run from the working directory;
    # appended, so a fastlight/ there never shadows this one.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    # The step-ticket stream has a length on purpose, read in the main process only.
    warnings.filterwarnings("ignore", message=".*`IterableDataset` has `__len__` defined.*")
    return FastlightCLI(
        RLModule,
        L.LightningDataModule,  # RolloutDataModule, DemoDataModule, or a user's own
        subclass_mode_model=True,
        subclass_mode_data=True,
        parser_class=FastlightArgumentParser,  # a refused command line: one line
        parser_kwargs={"parser_mode": "omegaconf", "fit": {"usage": FIT_USAGE, "description": FIT_HELP}},
        save_config_kwargs={"overwrite": True},
        # No --optimizer / --lr_scheduler: the module makes its optimizer; LightningCLI's would be made
        # before configure_model builds the policy, over no parameters at all.
        auto_configure_optimizers=False,
        args=args,
        run=run,
    )


#: LightningCLI subcommands that need a loop RLModule does not have (``fastlight evaluate`` plays episodes).
_NO_LOOP = ("validate", "test", "predict")


#: ``fastlight --help``: the three commands (LightningCLI's own would list fit, validate, test, predict).
TOP_HELP = """usage: fastlight {fit,evaluate,plot} ...

fastlight: RL training for uneven episode lengths (FAST, AcceRL) on PyTorch Lightning.

commands:
  fit        train:  fastlight fit --config configs/highway_dpsa.yaml
             (fastlight fit --help lists the groups; --model.help CLASS, --data.help CLASS their settings)
  evaluate   play a checkpoint's policy for full episodes:  fastlight evaluate --ckpt PATH [--episodes N]
  plot       learning curves from a run's CSV logs:  fastlight plot RUN_DIR [--x env_steps] [--y METRIC ...]

Each command takes --help."""


def main() -> None:
    # fastlight's own subcommands, dispatched before LightningCLI parses; imported here so that
    # ``fit`` does not load them.
    sub = sys.argv[1] if len(sys.argv) > 1 else None
    if sub in (None, "-h", "--help"):
        print(TOP_HELP, file=sys.stdout if sub else sys.stderr)
        raise SystemExit(0 if sub else 2)
    if sub in ("evaluate", "plot"):
        if sub == "evaluate":
            from fastlight.evaluate import main as command
        else:
            from fastlight.plot import main as command
        command(sys.argv[2:])
        return
    if sub in _NO_LOOP:
        print(
            f"fastlight: error: `fastlight {sub}` is not available: fastlight modules have no {sub} loop; "
            "`fastlight evaluate --ckpt PATH [--episodes N] [--video DIR]` plays a checkpoint's episodes",
            file=sys.stderr,
        )
        raise SystemExit(2)
    try:
        with one_line_errors():  # a bad setting: one line naming the flag (FASTLIGHT_DEBUG=1: traceback)
            try:
                cli_main()  # LightningCLI reads sys.argv itself
            except Preempted:
                # The process exits with 128 + signum: a second SIGTERM now would kill it by signal.
                ignore_stop_signals()
                raise
    except Exception as e:
        # A fault stop or a lost rank whose one line was printed: no traceback after it.
        lost = isinstance(e, RuntimeError) and peer_watch.reported_loss() is not None
        reported = stop_reported(e) or lost
        if reported and not debug_enabled():
            raise SystemExit(1) from None
        raise


if __name__ == "__main__":
    main()
