"""``RolloutDataModule``: streams Rollouts from background sampler processes.

``train_dataloader()`` starts ``num_workers`` sampler processes, each stepping its share of the ``num_envs``
clips with a CPU copy of the policy. :meth:`RolloutDataModule.publish` is the one place weights are published
to the samplers; ``teardown`` and ``on_exception`` stop them. Why step tickets: :mod:`fastlight.data.tickets`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import AttributeDict, rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader
from typing_extensions import override

from fastlight.data.advice import SamplingAdvice
from fastlight.data.cpu_copy import cpu_copy
from fastlight.data.data_settings import (
    check_data_settings,
    check_minibatches,
    check_type,
    max_valid_per_rollout,
    plain_settings,
    thread_plan,
    threads_line,
)
from fastlight.data.env_spec import EnvSizes, EnvSpec, task_names_of
from fastlight.data.exact_resume import EXACT_KEY, restore_exact, save_exact
from fastlight.data.prefetch import Prefetcher
from fastlight.data.protocols import ChecksEnvSpec, CopiesPolicy, RolloutPolicyModule, implements, require
from fastlight.data.sampler_plan import RankRounds, resolve_rank_rounds, sampler_configs
from fastlight.data.tickets import StepTickets
from fastlight.envs.registry import make_env
from fastlight.envs.wrappers import AnyEnvWrapper, EnvWrapper, wrap_env, wrapper_of
from fastlight.fleet.base import Fleet, FleetBuild, SamplerFleet
from fastlight.fleet.faults import FaultSettings
from fastlight.fleet.pool import LocalFleet
from fastlight.fleet.start import StartMethod, resolve_start_method
from fastlight.inference.settings import InferenceSettings
from fastlight.rank_state import PER_RANK_KEY, counters_for_rank, gather_per_rank, per_rank_entries, world
from fastlight.sampling.bundle import SamplerConfig
from fastlight.sampling.collector_settings import Nonfinite, ResetMode
from fastlight.sampling.exact import SamplerState
from fastlight.sampling.obs import obs_to_tensor, stack_obs
from fastlight.weights.publisher import SyncStats

__all__ = ["EnvSpec", "RolloutDataModule", "StepTickets", "cpu_copy"]

#: ``--data.faults`` when a config names none (frozen, so one shared default is safe).
DEFAULT_FAULTS = FaultSettings()
#: ``--data.fleet`` when a config names none: the rank's samplers are local processes.
DEFAULT_FLEET = LocalFleet()


class RolloutDataModule(EnvSizes, L.LightningDataModule):
    """Background sampling for on-policy RL. Every argument is keyword-only.

    Args:
        env_id: gymnasium id (highway-env ids import ``highway_env`` on demand).
        env_kwargs: keyword arguments for ``gym.make`` (e.g. ``{config: {...}}`` for highway-env).
        env_wrappers: :class:`~fastlight.envs.EnvWrapper` settings or gymnasium wrapper classes applied,
            in order, around every env (e.g. ``fastlight.envs.ScenarioLoadCost``, FAST §background).
        num_envs: environment clips in total per trainer rank, spread over the samplers.
        num_workers: sampler processes per trainer rank.
        reset_mode: how the envs reset (FAST §DPSA; see ``collector_settings.RESET_MODES``).
        termination_threshold: DPSA unified truncation when this fraction of clips has ended, or
            ``auto``: chosen every cycle (:mod:`fastlight.sampling.auto_threshold`).
        max_horizon: cycle cap in steps (then truncate and bootstrap) in the modes whose rounds are cycles.
        rollout_steps: steps per round in the other modes.
        cycles_per_step: sampling cycles each sampler contributes to one training step.
        group_size: this many consecutive envs of a sampler start every cycle from the same seed, the
            groups of GRPO; it must divide each sampler's envs; ``dpsa`` / ``sgr`` modes only.
        valid_steps_per_step: if set, every training step's Rollout holds at least this many valid
            transitions, so reset modes compare at equal data per update (FAST §Experiments).
        max_staleness: 0 = strictly on-policy; k = accept data up to k versions old (older: dropped).
        rank_rounds: whether the rank's samplers end their rounds ``together`` (local fleet only, not
            reproducible bit for bit; :mod:`fastlight.sampling.round_signal`) or ``apart``; ``auto``
            (default): ``together`` where it can work.
        prefetch: super-batches the background prefetcher keeps ready (AcceRL §prefetch).
        trainer_threads: the trainer's torch threads once its samplers start; ``None``: the cores left.
        inference: :class:`~fastlight.inference.InferenceSettings`: one inference worker serves every
            sampler (AcceRL §inference); ``None`` (default): each sampler acts with its own policy copy.
        faults: :class:`~fastlight.fleet.faults.FaultSettings`: timeouts and restart budget of the samplers.
        steps_per_epoch: training steps per Lightning epoch (the stream itself never ends).
        seed: base seed of the envs; rank ``r`` worker ``w`` uses ``seed + 10_000 r + 1_000 w``.
            ``None`` (default): the global seed (``--seed_everything``), else 0 (:attr:`env_seed`).
        nonfinite: a NaN / inf observation or reward: ``raise`` stops the run naming the env;
            ``drop`` pads that episode out and counts it as ``rollout/dropped_nonfinite``.
        start_method: ``spawn`` or ``forkserver``; ``None``: as :mod:`fastlight.fleet.start` resolves it.
        fleet: where the samplers run: local processes (default) or Ray actors (``RayFleet``).
        exact_resume: ``autoreset``: samplers save their envs after every round, so a resume
            continues their episodes (:mod:`fastlight.data.exact_resume`).
    """

    def __init__(
        self,
        *,
        env_id: str = "highway-fast-v0",
        env_kwargs: dict[str, Any] | None = None,
        env_wrappers: list[AnyEnvWrapper] | None = None,
        num_envs: int = 8,
        num_workers: int = 2,
        reset_mode: ResetMode = "dpsa",
        termination_threshold: float | Literal["auto"] = 0.5,
        max_horizon: int = 200,
        rollout_steps: int = 128,
        cycles_per_step: int = 1,
        group_size: int = 1,
        valid_steps_per_step: int | None = None,
        max_staleness: int = 0,
        rank_rounds: RankRounds = "auto",
        prefetch: int = 2,
        trainer_threads: int | None = None,
        inference: InferenceSettings | None = None,
        faults: FaultSettings = DEFAULT_FAULTS,
        steps_per_epoch: int = 50,
        seed: int | None = None,
        nonfinite: Nonfinite = "raise",
        start_method: StartMethod | None = None,
        fleet: Fleet = DEFAULT_FLEET,
        exact_resume: bool = False,
    ) -> None:
        super().__init__()
        check_type("fleet", fleet, Fleet)
        self.fleet = fleet
        self.env_wrappers: tuple[AnyEnvWrapper, ...] = tuple(env_wrappers or ())
        self.inference, self.faults = inference, faults
        check_data_settings(locals())
        #: ``together`` or ``apart``: ``--data.rank_rounds`` resolved for these settings and fleet.
        self.rank_rounds = resolve_rank_rounds(locals(), fleet)
        self.save_hyperparameters()
        self._plain_settings()
        # Pickled for the samplers: a gymnasium wrapper from jsonargparse holds the CLI, so rebuild it.
        wrappers = zip(self.env_wrappers, self.hparams.env_wrappers or (), strict=True)
        self.env_wrappers = tuple(w if isinstance(w, EnvWrapper) else wrapper_of(s) for w, s in wrappers)
        probe = wrap_env(make_env(env_id, env_kwargs=env_kwargs), self.env_wrappers)  # sizes the policy
        self.env_spec = EnvSpec.from_env(probe)
        # One observation, for the inference worker's shared-memory layout.
        self.example_obs = obs_to_tensor(stack_obs([probe.reset(seed=seed or 0)[0]]))
        # Task names of a multi-task env (None otherwise): DWR sizes itself from them.
        self.task_names = task_names_of(probe)
        probe.close()
        self.pool: SamplerFleet | None = None
        self.prefetcher: Prefetcher | None = None
        self._published = -1
        self._threads_before: int | None = None  # torch's thread count before trainer_threads
        self._handed: int | None = None  # the policy version of the last Rollout handed out
        self._warned_stalled = False
        h = self.hparams
        self.advice = SamplingAdvice(reset_mode=h.reset_mode, termination_threshold=h.termination_threshold,
                                     max_horizon=h.max_horizon, num_envs=h.num_envs)  # fmt: skip
        self.last_sync: SyncStats | None = None  # the latest publish's (None before the first)
        self.delivery = faults.delivery_check(keep=max_staleness + 1)  # did the published weights arrive?
        self.dropped_stale = 0
        # Each sampler's position after its last round handed out, and a resumed checkpoint's.
        self._sampler_states: dict[int, SamplerState] = {}
        self._resume_states: dict[int, SamplerState] = {}
        # Fault counters of earlier pools (a resumed run's, restored from the checkpoint).
        self._restarts_before = self._dropped_rollouts_before = 0

    def _plain_settings(self) -> None:
        """hparams (what loggers and checkpoints record) hold the settings objects as config data."""
        for hp in (self._hparams, self._hparams_initial):
            hp["inference"] = plain_settings(hp["inference"])
            hp["faults"] = plain_settings(hp["faults"])
            hp["fleet"] = plain_settings(hp["fleet"], class_path=True)
            wrappers = [plain_settings(w, class_path=True) for w in hp["env_wrappers"] or []]
            hp["env_wrappers"] = wrappers or None

    @property
    def group_size(self) -> int:
        """``--data.group_size`` (:class:`~fastlight.data.protocols.GroupsEnvs`)."""
        return int(self.hparams.group_size)

    @property
    @override
    def hparams_initial(self) -> AttributeDict:
        """What loggers record: these settings as ``data.<name>``, so no key clashes with the module's
        (Lightning logs both as one flat dict and refuses a key both hold with different values)."""
        return AttributeDict(
            {k if k.startswith("_") else f"data.{k}": v for k, v in super().hparams_initial.items()}
        )

    def evaluation_env(self) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        """The env evaluation episodes play (:class:`~fastlight.data.protocols.EvaluationEnv`)."""
        return self.hparams.env_id, dict(self.hparams.env_kwargs or {}), list(self.hparams.env_wrappers or [])

    def thread_plan(
        self, ranks_here: int, device: torch.device | str = "cpu"
    ) -> tuple[int | None, InferenceSettings | None]:
        """The trainer's torch threads (None: leave them) and the inference worker's settings."""
        kw = dict(shared_memory=self.fleet.shared_memory, ranks_here=ranks_here, device=device)
        return thread_plan(self.hparams, self.inference, **kw)

    @property
    def env_seed(self) -> int:
        """``--data.seed`` if set, else ``PL_GLOBAL_SEED`` (``seed_everything``), else 0."""
        if self.hparams.seed is not None:
            return int(self.hparams.seed)
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    def sampler_configs(self, rank: int) -> list[SamplerConfig]:
        configs = sampler_configs(self.hparams, rank=rank, seed=self.env_seed, env_wrappers=self.env_wrappers,
                                  rank_rounds=self.rank_rounds)  # fmt: skip
        return [replace(c, resume=self._resume_states.get(i)) for i, c in enumerate(configs)]

    def start(self, module: RolloutPolicyModule | None = None) -> None:
        """Spawn the samplers (and the inference worker) for the trainer's module. Idempotent.

        ``module`` (a :class:`RolloutPolicyModule`) drives the samplers without a Trainer."""
        if self.pool is not None:
            return
        if module is None:
            module = self.trainer.lightning_module
        require(module, RolloutPolicyModule, who="RolloutDataModule", what="a LightningModule")
        if isinstance(module, ChecksEnvSpec):
            module.check_env_spec(self.env_spec)
        self.check_minibatches(module)
        policy = module.rollout_copy() if implements(module, CopiesPolicy) else cpu_copy(module.policy)
        policy.eval()
        # The strategy's device, known before the model is moved there.
        root = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        rank = self.trainer.global_rank if self.trainer is not None else 0
        ranks_here = self.trainer.num_devices if self.trainer is not None else 1
        threads, inference = self.thread_plan(ranks_here, root)
        start_method = resolve_start_method(self.hparams.start_method)
        self.pool = self.fleet.build(FleetBuild(
            self.sampler_configs(rank), policy, rank=rank, inference=inference, trainer_device=root,
            example_obs=self.example_obs, faults=self.faults, start_method=start_method,
        ))  # fmt: skip
        if threads is not None and threads != torch.get_num_threads():
            self._threads_before = torch.get_num_threads()  # restored when the samplers stop
            torch.set_num_threads(threads)
            rank_zero_info(threads_line(self.hparams, threads, inference))
        self.pool.start()
        # Where rounds end together in an asynchronous run, a completed batch cuts the others in flight.
        cuts = self.rank_rounds == "together" and self.hparams.max_staleness > 0
        self.prefetcher = Prefetcher(
            self.pool.next_item,
            lambda: int(module.policy_version),
            items_per_batch=self.pool.num_workers,
            max_staleness=self.hparams.max_staleness,
            depth=self.hparams.prefetch,
            cut_in_flight=self.pool.cut_in_flight if cuts else None,
        ).start()

    def max_valid_per_rollout(self) -> int:
        """The most valid transitions one training step's Rollout can hold on this rank."""
        return max_valid_per_rollout(self.hparams)

    def check_minibatches(self, module: object) -> None:
        """Refuse, before any sampler starts, a ``--model.num_minibatches`` no Rollout can fill."""
        check_minibatches(self.hparams, module)

    @override
    def train_dataloader(self) -> DataLoader:
        if self.trainer is not None:
            self.start()
        # Its own generator: drawing from torch's global one would shift a resumed run's minibatch shuffles.
        tickets = StepTickets(self.hparams.steps_per_epoch)
        return DataLoader(tickets, batch_size=None, num_workers=0, generator=torch.Generator())

    @override
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if not isinstance(batch, (int, torch.Tensor)) or self.pool is None:
            return batch
        module = self.trainer.lightning_module
        self._check_version_advanced(module)
        self.publish(module)
        rollout = self.prefetcher.get(timeout=self.faults.worker_timeout_s)
        self.delivery.check(rollout.stats.weights_held)  # the receivers' checksums against the trainer's
        self.dropped_stale += rollout.stats.dropped_stale
        self.advice.update(rollout.stats)  # once, if the settings waste the run (cut episodes, resets)
        self._handed = int(module.policy_version)
        self._sampler_states.update(rollout.stats.sampler_states)
        return rollout

    def _check_version_advanced(self, module: RolloutPolicyModule) -> None:
        """A training step ran on the last Rollout; its update must have advanced the version."""
        version = int(module.policy_version)
        if self._handed is None or version != self._handed:
            return
        what = (
            f"{type(module).__name__}.policy_version has not advanced since {version}: a training step "
            f"ran on the Rollout sampled with version {version} and the version is still {version}"
        )
        todo = "the LightningModule must add 1 to policy_version after each update (RLModule does)"
        if self.hparams.max_staleness == 0:
            raise RuntimeError(
                f"{what}, so the samplers (--data.max_staleness 0) wait for new weights forever; {todo}"
            )
        if not self._warned_stalled:  # once: the samplers would otherwise fill the log with it
            self._warned_stalled = True
            rank_zero_warn(f"{what}: the samplers keep acting with these weights; {todo}")

    def publish(self, module: RolloutPolicyModule) -> SyncStats | None:
        """Make ``module.policy``'s weights current for the samplers, once per version. Returns the
        publish's :class:`SyncStats` (also :attr:`last_sync`), or None when this version is already out."""
        version = int(module.policy_version)
        if self.pool is None or version == self._published:
            return None
        self.last_sync = self.pool.publish(module.policy, version)
        self.delivery.published(module.policy, version, self.last_sync.mode)  # every N-th: its checksum
        self._published = version
        return self.last_sync

    def request_drain(self) -> None:
        if self.pool is not None:
            self.pool.request_drain()

    def set_task_weights(self, weights: list[float]) -> None:
        """Task-sampling weights for every sampler's envs (pushed by DynamicWeightedResampling)."""
        if self.pool is not None:
            self.pool.set_task_weights(weights)

    def fault_counters(self) -> dict[str, float]:
        """``faults/*`` totals of the run so far (logged by the module with each update)."""
        restarts, dropped = self._restarts_before, self._dropped_rollouts_before
        if self.pool is not None:
            restarts += self.pool.restarts
            dropped += self.pool.dropped_rollouts
        return {"faults/worker_restarts": float(restarts), "faults/dropped_rollouts": float(dropped)}

    @override
    def teardown(self, stage: str) -> None:
        self.stop()

    def on_exception(self, exception: BaseException) -> None:
        self.stop()

    def stop(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.stop()
            self.prefetcher = None
        if self.pool is not None:
            self.pool.stop()
            self._restarts_before += self.pool.restarts
            self._dropped_rollouts_before += self.pool.dropped_rollouts
            self.pool = None
            self._published = -1
            self._handed = None
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    @override
    def state_dict(self) -> dict[str, Any]:
        counters = self.fault_counters()
        own = {
            "dropped_stale": self.dropped_stale,
            "worker_restarts": int(counters["faults/worker_restarts"]),
            "dropped_rollouts": int(counters["faults/dropped_rollouts"]),
        }
        # The counters are this rank's own samplers': every rank's go into the file rank 0 writes.
        return own | {PER_RANK_KEY: gather_per_rank(own), EXACT_KEY: save_exact(self._sampler_states)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        rank, size = world()
        own = {k: v for k, v in state_dict.items() if k != PER_RANK_KEY}
        counters = counters_for_rank(per_rank_entries(state_dict, own), rank, size)
        self.dropped_stale = int(counters.get("dropped_stale", 0))
        self._restarts_before = int(counters.get("worker_restarts", 0))
        self._dropped_rollouts_before = int(counters.get("dropped_rollouts", 0))
        local = self.fleet.shared_memory
        self._resume_states = restore_exact(state_dict.get(EXACT_KEY), self.hparams, self.rank_rounds, local)
