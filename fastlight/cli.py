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

import lightning as L
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI

from fastlight.cli_callbacks import merge_repeated_callbacks
from fastlight.cli_output import one_line_errors, quiet_third_party
from fastlight.modules.rl_module import RLModule


class FastlightCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:  # noqa: ANN001 - jsonargparse parser
        for key in ("obs_dim", "action_dim", "continuous"):
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
        for cb in trainer.get("callbacks") or []:
            if getattr(cb, "class_path", None) == "lightning.pytorch.callbacks.ModelCheckpoint":
                if cb.get("init_args") is None:
                    cb["init_args"] = Namespace()
                if cb["init_args"].get("dirpath") is None:
                    cb["init_args"]["dirpath"] = os.path.join(root, "checkpoints")
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
        parser_kwargs={"parser_mode": "omegaconf"},
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )


def main() -> None:
    with one_line_errors():  # a bad setting: one line naming the flag (FASTLIGHT_DEBUG=1: traceback)
        cli_main()  # LightningCLI reads sys.argv itself


if __name__ == "__main__":
    main()
