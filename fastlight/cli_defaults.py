"""What the ``fastlight`` command adds to every run's config, and where a run's files go.

:func:`run_defaults` is one idempotent function of the parsed config, applied both before the trainer
is built and to the config ``--print_config`` prints, so the two show the same thing. Added, unless
the config has its own: ``PreemptionCheckpoint``, ``LostRankCheckpoint``, for a ``RolloutDataModule``
``EnvStepBudget`` (``env_steps`` logged; no budget), and TensorBoard and CSV loggers under
``--trainer.default_root_dir``. Done here rather than in the YAML, so that overriding the root dir on
the command line moves every output.

**Files.** Every run is version ``N``, the next number free in ``<root>/checkpoints``, ``<root>/tb``
and ``<root>/csv``, so one number names its checkpoints and its logs::

    <root>/checkpoints/version_N/   this run's checkpoints (ModelCheckpoint, TimedCheckpoint,
                                    PeriodicEvaluation's best.ckpt, PreemptionCheckpoint's last.ckpt)
    <root>/checkpoints/last.ckpt    the newest checkpoint of the latest run (PreemptionCheckpoint's)
    <root>/tb/version_N/, <root>/csv/version_N/

``<root>/checkpoints/last.ckpt`` is the stable path later stages and resumes use (``--ckpt_path last``
means it too). Its one writer is PreemptionCheckpoint: a ModelCheckpoint's ``save_last: true`` has
PreemptionCheckpoint save at every epoch end instead. A resumed run is a new version, never writing
the folder it resumed from. A callback or logger with a folder of the config's own is left there.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

from jsonargparse import Namespace

from fastlight.callbacks.env_steps import EnvStepBudget
from fastlight.callbacks.lost_rank import LostRankCheckpoint
from fastlight.callbacks.periodic_evaluation import PeriodicEvaluation
from fastlight.callbacks.preemption import PreemptionCheckpoint, checkpoint_step
from fastlight.callbacks.timed_checkpoint import TimedCheckpoint
from fastlight.class_paths import class_path, resolve, same_class
from fastlight.cli_callbacks import constructor_defaults, init_args, merge_repeated_callbacks
from fastlight.data.datamodule import RolloutDataModule

MODEL_CHECKPOINT = "lightning.pytorch.callbacks.ModelCheckpoint"
PREEMPTION = class_path(PreemptionCheckpoint)
ENV_STEPS = class_path(EnvStepBudget)
LOST_RANK = class_path(LostRankCheckpoint)
TIMED = class_path(TimedCheckpoint)
PERIODIC_EVAL = class_path(PeriodicEvaluation)
_SAVERS = (MODEL_CHECKPOINT, TIMED, PERIODIC_EVAL)  # the callbacks that save into the run's folder
#: The default loggers: class path and folder name under the root dir.
LOGGERS = (
    ("lightning.pytorch.loggers.TensorBoardLogger", "tb"),
    ("lightning.pytorch.loggers.CSVLogger", "csv"),
)
_VERSION = re.compile(r"version_(\d+)")


def root_dir(cfg: Namespace) -> str:
    """The run's ``--trainer.default_root_dir`` (``runs`` when unset)."""
    return (cfg.get("trainer") or Namespace()).get("default_root_dir") or "runs"


def next_version(root: str) -> int:
    """One more than the highest ``version_N`` in the root's checkpoint and logger folders (0 if none)."""
    taken = [-1]
    for name in ("checkpoints", *(folder for _, folder in LOGGERS)):
        try:
            entries = os.listdir(os.path.join(root, name))
        except OSError:  # not there yet
            continue
        taken += [int(m.group(1)) for e in entries if (m := _VERSION.fullmatch(e))]
    return max(taken) + 1


def complete_run_config(cfg: Namespace) -> Namespace:
    """:func:`run_defaults` with the version and the resume file read from the root dir. ``cfg`` is a
    subcommand's config or the whole one (then its subcommand's part is completed)."""
    sub = cfg.get("subcommand")
    if sub and isinstance(cfg.get(sub), Namespace):
        cfg = cfg.clone()
        cfg[sub] = complete_run_config(cfg[sub])
        return cfg
    if not isinstance(cfg.get("trainer"), Namespace):
        return cfg
    return run_defaults(cfg, version=next_version(root_dir(cfg)), last_exists=resume_last(cfg) != "last")


def forget_run_folders(cfg: Namespace) -> Namespace:
    """``cfg`` (a subcommand's config, or the whole one) without the folders :func:`run_defaults` filled
    in for an earlier run: a run's saved ``config.yaml`` given as ``--config`` then gets a version of its
    own, never the one it was saved by. The folders are recognised together: the PreemptionCheckpoint
    at ``<R>/checkpoints`` with version ``n``, checkpoint callbacks at ``<R>/checkpoints/version_n``, and
    the default loggers at ``R`` with version ``n``."""
    sub = cfg.get("subcommand")
    if sub and isinstance(cfg.get(sub), Namespace):
        cfg = cfg.clone()
        cfg[sub] = forget_run_folders(cfg[sub])
        return cfg
    trainer = cfg.get("trainer")
    callbacks = trainer.get("callbacks") if isinstance(trainer, Namespace) else None
    if not isinstance(callbacks, list):
        return cfg
    args = next((init_args(cb) for cb in callbacks if _is(cb, PREEMPTION)), Namespace())
    checkpoints, version = args.get("dirpath"), args.get("version")
    if not (isinstance(checkpoints, str) and isinstance(version, int)):
        return cfg
    if os.path.basename(os.path.normpath(checkpoints)) != "checkpoints":
        return cfg
    root = os.path.dirname(os.path.normpath(checkpoints))
    run_dir = os.path.join(checkpoints, f"version_{version}")
    cfg = cfg.clone()
    for cb in cfg["trainer"]["callbacks"]:
        args = init_args(cb) if isinstance(cb, Namespace) else Namespace()
        if _is(cb, PREEMPTION):
            args["dirpath"], args["version"] = None, None
        elif args.get("dirpath") == run_dir and any(_is(cb, p) for p in _SAVERS):
            args["dirpath"] = None
    derived = _default_loggers(root, version)
    loggers = cfg["trainer"].get("logger")
    if isinstance(loggers, list) and [_logger_key(x) for x in loggers] == [_logger_key(x) for x in derived]:
        cfg["trainer"]["logger"] = None
    return cfg


def _default_loggers(root: str, version: int) -> list[Namespace]:
    return [
        Namespace(class_path=p, init_args=Namespace(save_dir=root, name=n, version=version))
        for p, n in LOGGERS
    ]


def _logger_key(logger: Any) -> tuple[Any, ...] | None:
    if not isinstance(logger, Namespace):
        return None
    args = logger.get("init_args") or Namespace()
    return (logger.get("class_path"), args.get("save_dir"), args.get("name"), args.get("version"))


def resume_last(cfg: Namespace) -> str:
    """What ``--ckpt_path last`` resumes: ``<root>/checkpoints/last.ckpt`` or, where one is further on
    (global step), a complete sharded checkpoint ``<root>/checkpoints/version_N/sharded-step=<S>``;
    else ``last`` (Lightning's: no checkpoint found, training starts afresh)."""
    checkpoints = os.path.join(root_dir(cfg), "checkpoints")
    path = os.path.join(checkpoints, "last.ckpt")
    found = [(checkpoint_step(path, unless=""), 1, path)] if os.path.isfile(path) else []
    for meta in glob.glob(os.path.join(glob.escape(checkpoints), "version_*", "sharded-step=*", "meta.pt")):
        folder = os.path.dirname(meta)  # complete: Lightning writes meta.pt once every shard is on disk
        found.append((int(folder.rsplit("=", 1)[1]), 0, folder))
    return max(found)[2] if found else "last"


def run_defaults(cfg: Namespace, *, version: int, last_exists: bool) -> Namespace:
    """A copy of ``cfg`` (a subcommand's parsed config) with the command's callbacks, loggers and
    folders added; ``version`` numbers this run's folders and ``last_exists`` says whether
    ``<root>/checkpoints/last.ckpt`` is there for ``--ckpt_path last``."""
    cfg = cfg.clone()
    trainer = cfg["trainer"]
    root = root_dir(cfg)
    checkpoints = os.path.join(root, "checkpoints")
    run_dir = os.path.join(checkpoints, f"version_{version}")
    callbacks = trainer.get("callbacks")
    if isinstance(callbacks, Namespace):
        callbacks = [callbacks]
    # A fragment adds a callback the config may already have: update it, never run two.
    callbacks = list(merge_repeated_callbacks(callbacks) or [])
    every_epoch = False
    for cb in callbacks:
        path = cb.get("class_path") if isinstance(cb, Namespace) else None  # a callback object: as given
        if not any(same_class(path, p) for p in _SAVERS):
            continue
        args = init_args(cb)
        if args.get("dirpath") is None:
            args["dirpath"] = run_dir
            if same_class(path, MODEL_CHECKPOINT) and args.get("save_last"):
                # last.ckpt is PreemptionCheckpoint's: it saves at every epoch end instead.
                args["save_last"] = False
                every_epoch = True
    # Preemption-safe by default (a config that lists PreemptionCheckpoint itself chooses its settings).
    preemption = [cb for cb in callbacks if _is(cb, PREEMPTION)]
    if not preemption:
        preemption = [Namespace(class_path=PREEMPTION, init_args=_defaults(PreemptionCheckpoint))]
        callbacks.append(preemption[0])
    args = init_args(preemption[0])
    if args.get("dirpath") is None:
        args["dirpath"] = checkpoints
        if args.get("version") is None:
            args["version"] = version
    if every_epoch:
        args["every_epoch"] = True
    if not any(_is(cb, LOST_RANK) for cb in callbacks):  # it writes PreemptionCheckpoint's file
        callbacks.append(Namespace(class_path=LOST_RANK, init_args=_defaults(LostRankCheckpoint)))
    if cfg.get("ckpt_path") == "last" and last_exists:  # see resume_last
        found = resume_last(cfg)  # last.ckpt, or a sharded checkpoint further on
        cfg["ckpt_path"] = found if found != "last" else os.path.join(checkpoints, "last.ckpt")
    # Every RL run logs env_steps; one that lists EnvStepBudget itself sets a budget. A supervised
    # stage (DemoDataModule) has no env steps to count.
    if _samples_envs(cfg) and not any(_is(cb, ENV_STEPS) for cb in callbacks):
        callbacks.append(Namespace(class_path=ENV_STEPS, init_args=_defaults(EnvStepBudget)))
    trainer["callbacks"] = callbacks
    if trainer.get("logger") in (None, True):
        trainer["logger"] = _default_loggers(root, version)
    return cfg


def _samples_envs(cfg: Namespace) -> bool:
    """Whether the run's data module is a RolloutDataModule (a class path that does not import is
    counted as one: the parser will name it)."""
    data = cfg.get("data")
    path = data.get("class_path") if isinstance(data, Namespace) else None
    cls = resolve(path) if path else None
    return not isinstance(cls, type) or issubclass(cls, RolloutDataModule)


def _defaults(cls: type) -> Namespace:
    """Every constructor argument of ``cls`` at its default, as the parser fills a listed callback's."""
    return Namespace(**constructor_defaults(cls))


def _is(cb: Any, path: str) -> bool:
    return isinstance(cb, Namespace) and same_class(cb.get("class_path"), path)
