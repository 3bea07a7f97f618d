"""The head start: a ``fastlight fit`` run's samplers sample version 0 while the trainer still
imports Lightning.

Without it the samplers can only start once the trainer has imported Lightning, parsed the config,
built the module and published the version-0 weights; their first rounds then follow all of that
(``benchmarks/results/startup.md``: the first rollout came ~1.4x a bare ``import lightning`` on a
2-core machine). Version 0 of fastlight's default policy is a function of the config and the seed,
so the ``fastlight`` command (:mod:`fastlight.__main__`) plans the samplers and builds that policy
itself, right after it warms the forkserver and before it imports Lightning (:func:`launch`):
it reads the settings the samplers need from the command line and its config files
(:func:`~fastlight.fleet.start.peek_value`), probes the env, builds the
:class:`~fastlight.models.mlp.MLPActorCritic` under the run's seed as ``RLModule.build_policy``
would, starts a :class:`~fastlight.fleet.pool.SamplerPool` and publishes the policy as version 0.

Nothing is trusted: when the DataModule starts its samplers it hands what it would start to
:func:`claim`, which gives the pool over only if the sampler configs, the start method and every
weight and buffer of the version-0 policy are equal to the module's; otherwise it stops those
samplers (their rounds are dropped) and the DataModule starts its own, as without a head start,
after one line saying what differed. So a peek that guesses wrong costs the CPU it spent, never
the run's correctness.

Only a run the head start can plan exactly gets one: ``fastlight.RLModule`` building its own
policy (no ``--model.policy``, no ``--model.init_from``), ``fastlight.RolloutDataModule`` with
local samplers, no inference worker, env wrappers or custom fault settings, an integer seed, no
``--ckpt_path``, rank 0, and the forkserver warmed. ``--data.head_start false`` turns it off.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fastlight.data.sampler_plan import sampler_configs
from fastlight.fleet.pool import SamplerPool
from fastlight.fleet.start import peek_value, resolve_start_method, shadowing_entry
from fastlight.sampling.worker import SamplerConfig

log = logging.getLogger(__name__)

#: The module and data classes a head start can plan for (their config spellings).
RL_MODULES = ("fastlight.RLModule", "fastlight.modules.rl_module.RLModule")
DATA_MODULES = ("fastlight.RolloutDataModule", "fastlight.data.datamodule.RolloutDataModule")

#: ``RolloutDataModule``'s defaults for the settings the samplers' plan reads (a test keeps them
#: equal to its signature's).
DATA_DEFAULTS: dict[str, Any] = {
    "env_id": "highway-fast-v0",
    "env_kwargs": None,
    "num_envs": 8,
    "num_workers": 2,
    "reset_mode": "dpsa",
    "termination_threshold": 0.5,
    "max_horizon": 200,
    "rollout_steps": 128,
    "cycles_per_step": 1,
    "valid_steps_per_step": None,
    "max_staleness": 0,
    "truncation_scope": "sampler",
    "cut_in_flight": None,
    "seed": None,
    "nonfinite": "raise",
    "start_method": None,
    "head_start": True,
}
#: Data settings that must be absent (their defaults): the head start plans none of them.
DATA_UNPLANNED = ("env_wrappers", "inference", "faults", "fleet")
#: ``RLModule``'s defaults for the settings its default policy is built from.
MODEL_DEFAULTS: dict[str, Any] = {
    "hidden_sizes": (64, 64),
    "normalize_obs": None,
    "normalize_returns": None,
}
#: Model settings that must be absent: the policy is not built from the config alone then.
MODEL_UNPLANNED = ("policy", "init_from", "obs_dim", "action_dim", "continuous")
#: Environment variables of a launcher's non-zero rank (the head start plans rank 0's samplers).
RANK_VARS = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "GROUP_RANK")


@dataclass
class HeadStart:
    """A started pool of samplers acting with ``policy`` as version 0, waiting for the DataModule."""

    pool: SamplerPool
    configs: list[SamplerConfig]
    policy: nn.Module
    start_method: str
    #: The cores the samplers may use once claimed (None: never confined, see :func:`confine`).
    cores: set[int] | None = None


_head: HeadStart | None = None


def plan(argv: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any], int] | str:
    """The data settings, model settings and seed of the ``fit`` command line ``argv``, or why a
    head start cannot plan this run (a short reason)."""
    if any(a in ("-h", "--help") or a.startswith(("--print_config", "--ckpt_path")) for a in argv):
        return "help, --print_config or --ckpt_path"
    for var in RANK_VARS:
        if os.environ.get(var, "0") != "0":
            return f"{var}={os.environ[var]}"
    if shadowing_entry([""]) is not None:
        return "the working directory holds another fastlight"
    for section, allowed in (("model", RL_MODULES), ("data", DATA_MODULES)):
        found, path = peek_value(argv, section, "class_path")
        if not found or path not in allowed:
            return f"--{section} {path!r} is not one of {', '.join(allowed)}"
    data = {k: _peek(argv, "data", k, v) for k, v in DATA_DEFAULTS.items()}
    model = {k: _peek(argv, "model", k, v) for k, v in MODEL_DEFAULTS.items()}
    unset = [f"--data.{k}" for k in DATA_UNPLANNED if peek_value(argv, "data", k)[1] is not None]
    unset += [f"--model.{k}" for k in MODEL_UNPLANNED if peek_value(argv, "model", k)[1] is not None]
    if unset:
        return f"{', '.join(unset)} set"
    if data["head_start"] is False:
        return "--data.head_start false"
    if data["start_method"] == "spawn":
        return "--data.start_method spawn"
    seed = data["seed"] if data["seed"] is not None else peek_value(argv, None, "seed_everything")[1]
    if not isinstance(seed, int) or isinstance(seed, bool):
        return f"the seed is not an integer ({seed!r})"
    if data["env_kwargs"] is not None and not isinstance(data["env_kwargs"], dict):
        return "--data.env_kwargs is not a mapping"
    accelerator = peek_value(argv, "trainer", "accelerator")[1]
    if accelerator != "cpu" and _cuda_available():
        # Lightning builds the module's policy on the GPU then, from the CUDA generator.
        return f"--trainer.accelerator {accelerator!r} with a GPU"
    return data, model, seed


def launch(argv: Sequence[str]) -> HeadStart | None:
    """Start the samplers of the ``fit`` command line ``argv`` with its version-0 policy, where a
    head start can plan it (see the module docstring); None otherwise. Never raises: whatever goes
    wrong here, the DataModule starts the samplers itself later (and reports a real error then)."""
    global _head
    if _head is not None:
        return _head
    planned = plan(argv)
    if isinstance(planned, str):
        log.debug("fastlight: no head start: %s", planned)
        return None
    data, model, seed = planned
    pool = None
    try:
        start_method = resolve_start_method(data["start_method"])
        if start_method != "forkserver":
            return None  # the samplers would import everything themselves: no time to win
        from fastlight.data.env_spec import env_spec_of
        from fastlight.models.mlp import MLPActorCritic
        from fastlight.models.normalization import resolve_normalization, with_normalization

        spec = env_spec_of(data["env_id"], data["env_kwargs"])
        # As LightningCLI's seed_everything, then RLModule.build_policy and configure_model.
        torch.manual_seed(seed)
        policy: nn.Module = MLPActorCritic(
            spec.obs_dim,
            spec.action_dim,
            continuous=spec.continuous,
            hidden_sizes=tuple(model["hidden_sizes"]),
        )
        norm_obs, norm_ret = resolve_normalization(
            continuous=spec.continuous,
            obs_dim=spec.obs_dim,
            normalize_obs=model["normalize_obs"],
            normalize_returns=model["normalize_returns"],
        )
        policy = with_normalization(
            policy, obs_dim=spec.obs_dim, normalize_obs=norm_obs, normalize_returns=norm_ret
        ).eval()
        configs = sampler_configs(data, rank=0, seed=seed, env_wrappers=(), shared_memory=True)
        pool = SamplerPool(configs, policy, start_method=start_method)
        pool.start()
        pool.publish(policy, 0)
        cores = confine([p.pid for p in pool.procs])
    except Exception as e:  # noqa: BLE001
        log.debug("fastlight: no head start: %r", e)
        if pool is not None:
            pool.stop()
        return None
    _head = HeadStart(pool, configs, policy, start_method, cores)
    return _head


def claim(
    configs: list[SamplerConfig], policy: nn.Module, *, start_method: str, blocker: str | None = None
) -> SamplerPool | None:
    """The head start's pool, if it runs exactly the samplers the DataModule would start
    (``configs``, ``start_method``) with exactly ``policy`` as version 0 and nothing else rules it
    out (``blocker``: the DataModule's reason, e.g. an inference worker); else None, after stopping
    it and saying what differed. Later calls return None."""
    global _head
    head, _head = _head, None
    if head is None:
        return None
    if head.cores is not None:
        set_cores([p.pid for p in head.pool.procs], head.cores)
    differs = blocker or mismatch(head, configs, policy, start_method=start_method)
    if differs is None:
        return head.pool
    head.pool.stop()
    from lightning.pytorch.utilities import rank_zero_info

    rank_zero_info(f"fastlight: the head start's samplers were stopped ({differs}); starting them again")
    return None


def mismatch(
    head: HeadStart, configs: list[SamplerConfig], policy: nn.Module, *, start_method: str
) -> str | None:
    """What differs between the head start and what the DataModule would start (None: nothing)."""
    if head.start_method != start_method:
        return f"start method {head.start_method} vs {start_method}"
    if head.configs != configs:
        return "sampler settings differ"
    return policy_mismatch(head.policy, policy)


def policy_mismatch(a: nn.Module, b: nn.Module) -> str | None:
    """Where two policies differ (type, tensor names, shapes or any value: bitwise, as both are
    built by the same code from the same seed on this machine's CPU), or None."""
    if type(a) is not type(b):
        return f"policy {type(a).__name__} vs {type(b).__name__}"
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys():
        return "policy tensors differ in names"
    for name, t in sa.items():
        u = sb[name]
        if t.shape != u.shape or t.dtype != u.dtype or not torch.equal(t, u.to(t.device)):
            return f"version-0 weights differ ({name})"
    return None


def confine(pids: list[int]) -> set[int] | None:
    """Keep processes ``pids`` off one of this process's cores until :func:`set_cores` gives it back;
    returns the cores they had (None: nothing changed, on a single core or without affinity).

    The trainer's start-up is one thread, and it is what the first rollout waits for: with the
    samplers free to run anywhere, the scheduler shares every core between them and the trainer's
    imports (on 2 cores, two samplers and the trainer: the trainer gets two thirds of one), and the
    head start wins nothing. Kept off one core, the samplers use the others and the trainer's
    imports run at full speed."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cores = set(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    set_cores(pids, cores - {min(cores)})
    return cores


def set_cores(pids: list[int], cores: set[int]) -> None:
    """Set the CPU affinity of every thread of processes ``pids`` (a process that has exited is
    skipped)."""
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            tids = [pid]
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cores)
            except OSError:
                pass


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def _peek(argv: Sequence[str], section: str, key: str, default: Any) -> Any:
    found, value = peek_value(argv, section, key)
    if not found:
        return default
    if isinstance(default, tuple) and isinstance(value, list):
        return tuple(value)
    return value
