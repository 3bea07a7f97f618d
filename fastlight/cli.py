"""``fastlight`` command line: LightningCLI in omegaconf mode, with subclass modes.

    fastlight fit --config configs/highway_dpsa.yaml
    fastlight fit --config configs/highway_dpsa.yaml --trainer.max_steps 3
    fastlight fit --config configs/highway_dpsa.yaml --print_config

Constructor signatures are the schema. The env's observation and action sizes are linked from
the DataModule to the model after the DataModule is built, so a config never repeats them (the
default policy is built from them; a policy injected with ``--model.policy`` class_path/init_args
carries its own sizes, checked against the env before any sampler starts).
"""

from __future__ import annotations

import os
import sys
import warnings
from argparse import ArgumentError
from typing import Any

import lightning as L
import torch
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO

from fastlight.callbacks.preemption import PreemptionCheckpoint
from fastlight.checkpoints import AtomicCheckpointIO
from fastlight.class_paths import class_path, same_class
from fastlight.cli_callbacks import merge_repeated_callbacks
from fastlight.cli_output import one_line_errors, quiet_third_party
from fastlight.cli_parser import FastlightArgumentParser
from fastlight.modules.objective_hparams import legacy_setting_hint
from fastlight.modules.rl_module import RLModule

_MODEL_CHECKPOINT = "lightning.pytorch.callbacks.ModelCheckpoint"
_PREEMPTION = class_path(PreemptionCheckpoint)
_ENV_STEPS = "fastlight.callbacks.env_steps.EnvStepBudget"
#: Model arguments the CLI links from the data module: not the user's to set, never a difference.
_LINKED = ("obs_dim", "action_dim", "continuous")


def _entry_path(cb: Any) -> str | None:
    """The ``class_path`` of a parsed callback entry; ``None`` for a callback object given as such."""
    return cb.get("class_path") if isinstance(cb, Namespace) else None


class FastlightCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:  # noqa: ANN001 - jsonargparse parser
        for key in _LINKED:
            parser.link_arguments(f"data.{key}", f"model.init_args.{key}", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        """Default loggers: TensorBoard and CSV under ``--trainer.default_root_dir``.

        Done here rather than in the YAML so that overriding the root dir on the command line
        moves every output (a YAML interpolation would be resolved before the override).
        """
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        trainer = cfg["trainer"]
        root = trainer.get("default_root_dir") or "runs"
        # A fragment adds a callback the config may already have: update it, never run two.
        trainer["callbacks"] = merge_repeated_callbacks(trainer.get("callbacks"))
        # Checkpoints at <root>/checkpoints (not under a logger's version folder), so that the next
        # stage finds them (e.g. the RL config's --model.init_from <sft root>/checkpoints/last.ckpt).
        callbacks = trainer.get("callbacks") or []
        for cb in callbacks:
            if any(same_class(_entry_path(cb), p) for p in (_MODEL_CHECKPOINT, _PREEMPTION)):
                if cb.get("init_args") is None:
                    cb["init_args"] = Namespace()
                if cb["init_args"].get("dirpath") is None:
                    cb["init_args"]["dirpath"] = os.path.join(root, "checkpoints")
        # Preemption-safe by default: a checkpoint on SIGTERM / SIGINT / SIGUSR1, on a fault, and
        # every 30 minutes (a config that lists PreemptionCheckpoint itself chooses its settings).
        if not any(same_class(_entry_path(cb), _PREEMPTION) for cb in callbacks):
            init_args = Namespace(dirpath=os.path.join(root, "checkpoints"))
            callbacks.append(Namespace(class_path=_PREEMPTION, init_args=init_args))
            trainer["callbacks"] = callbacks
        # Every run logs env_steps (the unit an RL user plans in); one that lists EnvStepBudget itself
        # (e.g. --trainer.callbacks+=EnvStepBudget --trainer.callbacks.total_env_steps N) sets a budget.
        if not any(same_class(_entry_path(cb), _ENV_STEPS) for cb in callbacks):
            callbacks.append(Namespace(class_path=_ENV_STEPS, init_args=Namespace()))
            trainer["callbacks"] = callbacks
        if trainer.get("logger") in (None, True):
            trainer["logger"] = [
                Namespace(
                    class_path="lightning.pytorch.loggers.TensorBoardLogger",
                    init_args=Namespace(save_dir=root, name="tb"),
                ),
                Namespace(
                    class_path="lightning.pytorch.loggers.CSVLogger",
                    init_args=Namespace(save_dir=root, name="csv"),
                ),
            ]


    def parse_arguments(self, parser, args) -> None:  # noqa: ANN001 - jsonargparse parser and args
        """LightningCLI's parsing, but a setting of the old objective interface (``--model.objective
        gipo``, ``gipo_sigma: 0.2`` ...) is refused with one line saying what to write instead."""
        subcommands = parser._subcommands_action
        parsers = [parser, *(subcommands._name_parser_map.values() if subcommands else ())]
        exits = [p.exit_on_error for p in parsers]
        for p in parsers:
            p.exit_on_error = False
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as error:
            hint = legacy_setting_hint(str(error))
            if hint is not None:
                raise ValueError(hint) from None
            for p, exit_on_error in zip(parsers, exits, strict=True):
                p.exit_on_error = exit_on_error
            parser.error(str(error), error.__cause__)  # jsonargparse's own report, as without this
        finally:
            for p, exit_on_error in zip(parsers, exits, strict=True):
                p.exit_on_error = exit_on_error

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        """Atomic checkpoint files unless the user brings a CheckpointIO of their own."""
        plugins = self._get(self.config_init, "trainer", default={}).get("plugins")
        plugins = [] if plugins is None else list(plugins) if isinstance(plugins, list) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        trainer = super().instantiate_trainer(**kwargs)
        for cb in trainer.callbacks:
            if isinstance(cb, PreemptionCheckpoint):
                cb.resume_hint = "--ckpt_path {path}"  # this command's way to resume
        return trainer

    def _parse_ckpt_path(self) -> None:
        """``--ckpt_path`` resumes with the settings the user typed (config + command line).

        LightningCLI would overwrite the parsed model settings with the checkpoint's, silently
        undoing e.g. ``--model.lr 0.01``. Here the typed settings are kept and one line lists
        those that differ from the checkpoint's; the module applies a changed learning rate to
        the restored optimizer too (:meth:`RLModule.on_load_checkpoint`). A missing, truncated or
        non-checkpoint file is refused naming the path. ``--model.init_from`` is not read when
        resuming (the checkpoint holds the weights), so a moved SFT checkpoint does not stop it.
        """
        sub = self.config.get("subcommand")
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        if not ckpt_path or ckpt_path in ("last", "best", "hpc", "registry"):
            return
        from fastlight.checkpoints import read_checkpoint

        saved = dict(read_checkpoint(ckpt_path, flag="--ckpt_path").get("hyper_parameters") or {})
        model = self.config[sub].get("model")
        if model is None or getattr(model, "class_path", None) is None:
            return super()._parse_ckpt_path()  # nothing typed: rebuild the checkpoint's model
        init_args = model.get("init_args")
        init_from = init_args.get("init_from") if init_args is not None else None
        if init_from:
            # The checkpoint restores the weights after configure_model: loading init_from first
            # would be moot, and would fail on a file moved or deleted since the run started.
            init_args["init_from"] = None
            print(
                f"fastlight: resuming {ckpt_path}: --model.init_from {init_from} is not read "
                "(the checkpoint holds the weights)",
                file=sys.stderr,
                flush=True,
            )
        diffs = _differences(saved, model)
        if diffs:
            print(
                f"fastlight: resuming {ckpt_path} with settings that differ from the checkpoint's "
                f"(yours apply): {'; '.join(diffs)}",
                file=sys.stderr,
                flush=True,
            )


def _plain(value: Any) -> Any:
    if isinstance(value, Namespace):
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "_instantiator"}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def _differences(saved: dict[str, Any], model: Namespace) -> list[str]:
    """``--model.<key> <yours> (checkpoint: <theirs>)`` for every setting both sides hold."""
    out = []
    theirs_class = saved.get("_class_path")
    if theirs_class and not same_class(theirs_class, model.class_path):
        out.append(f"--model.class_path {model.class_path} (checkpoint: {theirs_class})")
    mine = _plain(model.get("init_args") or Namespace())
    for key, value in mine.items():
        if key in _LINKED or key == "init_from" or key not in saved:  # init_from: not read on resume
            continue
        theirs = _plain(saved[key])
        if theirs != value:
            out.append(f"--model.{key} {value} (checkpoint: {theirs})")
    return out


def cli_main(args: list[str] | None = None, *, run: bool = True) -> FastlightCLI:
    # Rendering backends for MuJoCo (Meta-World) without a display.
    os.environ.setdefault("MUJOCO_GL", "egl")
    quiet_third_party()  # Lightning's tips and known-harmless warnings
    # Like `python -m`, resolve class paths of the project being run (e.g. examples.*, a
    # user's own module) from the working directory; console scripts do not add it.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    # The step-ticket stream has a length on purpose (epochs for checkpointing); it is read in
    # the main process only, so Lightning's multi-worker caveat does not apply.
    warnings.filterwarnings("ignore", message=".*`IterableDataset` has `__len__` defined.*")
    return FastlightCLI(
        RLModule,
        L.LightningDataModule,  # RolloutDataModule, DemoDataModule, or a user's own
        subclass_mode_model=True,
        subclass_mode_data=True,
        parser_class=FastlightArgumentParser,  # a bad Literal value or a moved setting: one line
        parser_kwargs={"parser_mode": "omegaconf"},
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )


#: LightningCLI subcommands that need a loop RLModule does not have (no validation / test / predict
#: step: an RL module is judged by playing episodes, which ``fastlight evaluate`` does).
_NO_LOOP = ("validate", "test", "predict")


def main() -> None:
    # fastlight's own subcommands, dispatched before LightningCLI parses (``fit`` is unchanged);
    # imported here so that ``fit`` does not load them.
    sub = sys.argv[1] if len(sys.argv) > 1 else None
    if sub == "evaluate":
        from fastlight.evaluate import main as evaluate

        evaluate(sys.argv[2:])
        return
    if sub == "plot":
        from fastlight.plot import main as plot

        plot(sys.argv[2:])
        return
    if sub in _NO_LOOP:
        print(
            f"fastlight: error: `fastlight {sub}` is not available: fastlight modules have no {sub} loop; "
            "`fastlight evaluate --ckpt PATH [--episodes N] [--video DIR]` plays a checkpoint's episodes",
            file=sys.stderr,
        )
        raise SystemExit(2)
    with one_line_errors():  # a bad setting: one line naming the flag (FASTLIGHT_DEBUG=1: traceback)
        cli_main()  # LightningCLI reads sys.argv itself


if __name__ == "__main__":
    main()
