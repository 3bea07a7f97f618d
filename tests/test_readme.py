"""Every shell command in README.md runs as pasted, or is listed in ``NOT_RUN`` with the reason.

The commands are read out of the README's fenced shell blocks (```bash, sh, shell, console) and
run, in README order, in a scratch copy of the repository's command-line folders (``configs/``,
``callbacks/``, ``examples/``, ``benchmarks/``), through the venv's own console script
(``<venv>/bin/fastlight``) and interpreter, with a few size flags appended (``RUN``) so each is
one quick step. ``MUJOCO_GL`` is removed from their environment: the Meta-World camera config
renders only if the ``fastlight`` command sets it itself. A README command that is neither in
``RUN`` nor in ``NOT_RUN`` fails ``test_every_readme_command_is_run_or_listed``, and so does an
entry of either that the README no longer has.

The quick commands (the highway chain fit -> evaluate -> plot -> learning check, the camera
config, a user's own env; 139 s on 2 cores) and the rest (the other highway variants, the plain
Lightning PPO project, the VLA SFT -> RL -> evaluation chain, two-process DDP) run in
``make test-slow``: together they are over ``make test``'s budget. ``make test`` checks that every
README command is run here or listed with its reason, and how the commands are split.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.test_cli import tiny_overrides

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: The console script and interpreter of the venv running the tests (not whatever is on PATH).
BIN = Path(sys.executable).parent
#: What the README's commands read from the working directory (configs, fragments, ``-m`` modules).
COPIED = ("configs", "callbacks", "examples", "benchmarks")
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}


# ---------------------------------------------------------------------- reading the README
def split_commands(lines: list[str], prompts_only: bool) -> list[str]:
    """One string per command of a shell block: backslash continuations joined, comments and
    ``$ `` prompts dropped, whitespace collapsed. ``prompts_only`` (a console block): only ``$``
    lines are commands, the rest is their output."""
    commands, pending = [], None
    for raw in lines:
        line = raw.strip()
        if pending is None:
            if prompts_only and not line.startswith("$ "):
                continue
            line = line.removeprefix("$ ")
        else:
            line = f"{pending} {line}"
            pending = None
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        line = strip_comment(line)
        if line:
            commands.append(" ".join(line.split()))
    assert pending is None, f"README.md: a shell block ends in a backslash continuation: {pending!r}"
    return commands


def strip_comment(line: str) -> str:
    """``line`` without its trailing ``# comment`` (a ``#`` that shell would read as one)."""
    words = shlex.split(line, comments=True)
    for match in re.finditer(r"(^|\s)#", line):
        head = line[: match.start()].rstrip()
        if shlex.split(head, comments=True) == words:
            return head
    return line


def readme_commands(text: str) -> list[str]:
    """The commands of every fenced shell block of ``text``, in order."""
    commands, block, lang = [], None, ""
    for line in text.splitlines():
        fence = re.match(r"^\s*```\s*([\w+-]*)", line)
        if fence and block is None:
            block, lang = [], fence.group(1).lower()
        elif fence and line.strip() == "```":
            if lang in SHELL_BLOCKS:
                commands += split_commands(block, prompts_only=lang == "console")
            block = None
        elif block is not None:
            block.append(line)
    assert block is None, "README.md: a fenced block is never closed"
    return commands


COMMANDS = readme_commands(README.read_text())


# ---------------------------------------------------------------------- how each command runs
@dataclass
class Done:
    """One finished command: where it ran, when it started, what it printed."""

    command: str
    cwd: Path
    started: float
    output: str

    def written(self, path: str | Path) -> Path:
        """``path`` (relative to the working copy), asserted to be a file this command wrote."""
        p = self.cwd / path
        assert p.is_file(), f"{self.command!r} did not write {path}"
        assert p.stat().st_mtime >= self.started, f"{path} is older than {self.command!r}"
        return p


@dataclass(frozen=True)
class Run:
    """A README command that runs: the flags appended to make it one quick step, what it must
    leave behind, and whether it waits for the whole README's fits first (``last``)."""

    extra: tuple[str, ...]
    check: Callable[[Done], None]
    slow: bool = False
    last: bool = False


def root_dir(command: str) -> str:
    """``trainer.default_root_dir`` of a ``fastlight fit`` command: its last flag, else its first
    ``--config``'s."""
    words = shlex.split(command)
    if "--trainer.default_root_dir" in words:
        return words[words.index("--trainer.default_root_dir") + 1]
    with open(ROOT / words[words.index("--config") + 1]) as f:
        return yaml.safe_load(f)["trainer"]["default_root_dir"]


def fitted(steps: int, env_id: str | None = None) -> Callable[[Done], None]:
    """A fit that stopped at ``--trainer.max_steps steps`` and wrote ``<root>/checkpoints/last.ckpt``
    (and, for a run with ``env_id``, recorded it) and ``<root>/csv/version_N/metrics.csv``."""

    def check(done: Done) -> None:
        import torch

        assert f"`Trainer.fit` stopped: `max_steps={steps}` reached." in done.output
        root = root_dir(done.command)
        ckpt = torch.load(
            done.written(f"{root}/checkpoints/last.ckpt"), weights_only=False, map_location="cpu"
        )
        assert ckpt["global_step"] >= steps  # Lightning stops at the first batch boundary at or past it
        if env_id is not None:
            assert ckpt["datamodule_hyper_parameters"]["env_id"] == env_id
        versions = sorted(
            (done.cwd / root / "csv").glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:])
        )
        assert versions, f"no {root}/csv/version_N/metrics.csv"
        done.written(versions[-1].relative_to(done.cwd))

    return check


def noticed(steps: int, env_id: str, policy: str) -> Callable[[Done], None]:
    """:func:`fitted`, and the one line saying which default policy the env's spaces got."""

    def check(done: Done) -> None:
        fitted(steps, env_id=env_id)(done)
        assert f"fastlight: policy {policy}\n" in done.output

    return check


def printed_config(done: Done) -> None:
    """``--print_config`` prints the resolved YAML and runs nothing."""
    config = yaml.safe_load(done.output[done.output.index("# lightning.pytorch==") :])
    assert config["trainer"]["default_root_dir"] == "runs/highway_dpsa"
    assert config["data"]["init_args"]["env_id"] == "highway-fast-v0"
    assert config["data"]["init_args"]["reset_mode"] == "dpsa"  # a default, not in the YAML
    new = [p for p in done.cwd.glob("runs/**/*") if p.stat().st_mtime >= done.started]
    assert not new and "Trainer.fit" not in done.output, new


def evaluated(ckpt: str, env_id: str, episodes: int, gifs: str | None = None) -> Callable[[Done], None]:
    """``fastlight evaluate``'s result line, its numbers, and the results file (and GIFs)."""

    def check(done: Done) -> None:
        head = re.escape(f"fastlight evaluate: {ckpt} (")
        tail = re.escape(f") on {env_id}, {episodes} episodes from seed 10000, greedy actions")
        assert re.search(rf"^{head}fastlight\.\w+, policy_version \d+{tail}$", done.output, re.M), done.output
        assert re.search(r"^  mean return +-?\d+\.\d{3} +95% CI \[", done.output, re.M)
        if env_id.startswith("highway"):  # FAST's driving metrics come by themselves on highway-env
            assert re.search(r"^    min_ttc_s +\S+  \[\S+, \S+\]$", done.output, re.M), done.output
        done.written(ckpt.removesuffix(".ckpt") + ".eval.json")
        if gifs is not None:
            found = sorted((done.cwd / gifs).glob("*.gif"))
            assert f"and {len(found)} GIFs under {gifs}" in done.output and len(found) == episodes
            for gif in found:
                assert gif.read_bytes()[:4] == b"GIF8"

    return check


def plotted(done: Done) -> None:
    assert "fastlight plot: wrote curve.png" in done.output
    assert done.written("curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def learning_check(done: Done) -> None:
    out = "runs/highway_dpsa/checkpoints/last_learning"
    assert "Trained / random mean return" in done.written(f"{out}/main_job.md").read_text()
    assert '"p_value":' in done.output


def vla_report(done: Done) -> None:
    report = done.written("benchmarks/results/vla_mt10.md").read_text()
    for label in ("sft", "rl"):
        assert f"python -m benchmarks.vla.eval: {label} done in" in done.output
        assert label in report


def bc_model(done: Done) -> None:
    import torch

    payload = torch.load(done.written("runs/bc_mlp/mlp1.pt"), weights_only=False)
    assert payload["demos_per_task"] == 1 and len(payload["task_names"]) == 10


def plain_ppo(done: Done) -> None:
    assert "`Trainer.fit` stopped: `max_steps=2000` reached." in done.output
    assert list((done.cwd / "runs/plain_ppo").glob("lightning_logs/version_*/events.out.tfevents.*"))


def short_plain_ppo(done: Done) -> None:
    assert "`Trainer.fit` stopped: `max_steps=64` reached." in done.output


def tiny_llava(done: Done) -> None:
    import json

    assert json.loads(done.written("runs/tiny_llava/config.json").read_text())["model_type"] == "llava"
    done.written("runs/tiny_llava/processor_config.json")


def two_nodes(steps: int) -> Callable[[Done], None]:
    """Two torchrun "nodes" of one rank each: one job that stopped at ``max_steps``, whose checkpoint
    rank 0 wrote with both ranks' own counters in it."""

    def check(done: Done) -> None:
        import torch

        from fastlight.checkpoints import verify_checksum

        assert done.output.count(f"`Trainer.fit` stopped: `max_steps={steps}` reached.") == 1, done.output
        path = done.written(MT10_LAST)
        assert verify_checksum(path) is True
        ckpt = torch.load(path, weights_only=False, map_location="cpu")
        assert ckpt["global_step"] == steps and len(ckpt["RolloutDataModule"]["per_rank"]) == 2

    return check


def without(flags: tuple[str, ...], flag: str) -> tuple[str, ...]:
    """``flags`` (flag, value pairs) less ``flag``: a command keeps a size it sets itself."""
    i = flags.index(flag)
    return flags[:i] + flags[i + 2 :]


TINY = tuple(tiny_overrides())  # tests/test_cli.py's one-step sizes of every RolloutDataModule config
#: Meta-World MT10 episodes of 5 steps, so the evaluations of these checkpoints are short too.
MT10_TINY = (*TINY, "--data.env_kwargs.max_path_length", "5")
#: The SFT stage (DemoDataModule): one short demo per task; 4 optimizer steps, one epoch and one
#: logged row at the config's log_every_n_steps: 4.
SFT_TINY = (
    "--data.num_workers", "0", "--data.max_attempts_per_demo", "1", "--data.successful_only", "false",
    "--data.env_kwargs.max_path_length", "5", "--trainer.max_steps", "4",
    "--trainer.enable_progress_bar", "false",
)  # fmt: skip
HIGHWAY = "fastlight fit --config configs/highway_dpsa.yaml"
REACH = "fastlight fit --config configs/vla_metaworld_reach.yaml"
MT10 = "fastlight fit --config configs/vla_metaworld_mt10.yaml"
LAST = "runs/highway_dpsa/checkpoints/last.ckpt"
MT10_LAST = "runs/vla_metaworld_mt10/checkpoints/last.ckpt"
#: Two torchrun "nodes" on one machine, as the README writes them.
TWO_NODES = (
    "bash -c 'for rank in 1 0; do torchrun --nnodes 2 --nproc_per_node 1 --node_rank $rank "
    "--master_addr 127.0.0.1 --master_port 29500 -m fastlight fit --config configs/vla_metaworld_mt10.yaml "
    "--model.init_from null --trainer.strategy ddp --trainer.accelerator cpu --trainer.devices 1 "
    '--trainer.num_nodes 2 "$@" & done; wait -n && wait -n\' two-nodes --trainer.max_steps 8'
)

#: README command -> how it runs. Highway runs write runs/highway_dpsa, the quick look its own root
#: (README order: the evaluations read the main job's checkpoint; the user's own env comes after them).
RUN: dict[str, Run] = {
    f"{HIGHWAY}": Run(TINY, fitted(1)),
    f"{HIGHWAY} --trainer.max_steps 3 --trainer.default_root_dir runs/quick_look": Run(
        without(TINY, "--trainer.max_steps"), fitted(3)
    ),
    f"{HIGHWAY} --print_config": Run((), printed_config),
    f"{HIGHWAY} --data.reset_mode sgr": Run(TINY, fitted(1), slow=True),
    f"{HIGHWAY} --trainer.callbacks+=EnvStepBudget --trainer.callbacks.total_env_steps 200000": Run(
        TINY, fitted(1), slow=True
    ),
    f"{HIGHWAY} --config callbacks/throughput.yaml": Run(TINY, fitted(1), slow=True),
    f"{REACH} --config callbacks/dwr.yaml": Run(TINY, fitted(1)),
    f"{HIGHWAY} --trainer.callbacks+=RolloutThroughput": Run(TINY, fitted(1), slow=True),
    "python -m examples.plain_ppo.ppo": Run((), plain_ppo, slow=True),
    "python -m examples.plain_ppo.ppo_callbacks": Run((), plain_ppo, slow=True),
    "python -m examples.plain_ppo.ppo_fastlight": Run((), plain_ppo, slow=True),
    "python -m examples.plain_ppo.ppo 64": Run((), short_plain_ppo, slow=True),
    f"fastlight evaluate --ckpt {LAST} --episodes 20": Run(
        ("--episodes", "2"), evaluated(LAST, "highway-fast-v0", 2)
    ),
    f"fastlight evaluate --ckpt {LAST} --episodes 3 --video runs/videos": Run(
        ("--episodes", "1"), evaluated(LAST, "highway-fast-v0", 1, gifs="runs/videos")
    ),
    f"fastlight evaluate --ckpt {MT10_LAST} --episodes 5": Run(
        ("--episodes", "1"),
        evaluated(MT10_LAST, "fastlight/MetaWorld-v0", 10),  # --episodes per task: 10 in all
        slow=True,
        last=True,  # the MT10 RL run it evaluates is further down the README
    ),
    "fastlight plot runs/highway_dpsa --x env_steps --y rollout/return rollout/crash_rate "
    "--out curve.png": Run((), plotted),
    f"python -m benchmarks.learning --ckpt {LAST} --episodes 30": Run(("--episodes", "2"), learning_check),
    "fastlight fit --config configs/vla_metaworld_mt10_sft.yaml --data.demos_per_task 1": Run(
        SFT_TINY, fitted(4), slow=True
    ),
    f"{MT10}": Run(MT10_TINY, fitted(1), slow=True),  # --model.init_from: the SFT run's last.ckpt
    "python -m benchmarks.vla.eval --ckpt sft=runs/vla_metaworld_mt10_sft/checkpoints/last.ckpt "
    f"--ckpt rl={MT10_LAST} --episodes-per-task 20": Run(("--episodes-per-task", "1"), vla_report, slow=True),
    "python -m benchmarks.vla.bc_baseline --demos-per-task 1 --time 300 --out runs/bc_mlp/mlp1.pt": Run(
        ("--time", "1", "--max-steps", "1"), bc_model, slow=True
    ),
    f"{REACH}": Run(TINY, fitted(1), slow=True),
    'python -c "from fastlight.envs.instructions import INSTRUCTIONS; from benchmarks.tiny_vlm import '
    "save_tiny_vlm; save_tiny_vlm('llava', 'runs/tiny_llava', sentences=list(INSTRUCTIONS.values()))\"": Run(
        (), tiny_llava, slow=True
    ),
    f"{REACH} --model.policy.init_args.backbone runs/tiny_llava": Run(TINY, fitted(1), slow=True),
    f"{REACH} --model.policy.init_args.backbone runs/tiny_llava --model.policy.init_args.lora "
    "'{r: 16, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj]}'": Run(TINY, fitted(1), slow=True),
    "fastlight fit --config examples/hf_vla/reach.yaml": Run(TINY, fitted(1), slow=True),
    f"{MT10} --trainer.strategy ddp --trainer.devices 2": Run(MT10_TINY, fitted(1), slow=True),
    # The flags after `two-nodes` reach both nodes' fits: the tiny sizes too.
    TWO_NODES: Run(without(MT10_TINY, "--trainer.max_steps"), two_nodes(8), slow=True),
    f"{HIGHWAY} --data.env_id mypkg:mypkg/Uneven-v0 --data.env_kwargs '{{}}' "
    "--trainer.default_root_dir runs/uneven": Run(TINY, fitted(1, env_id="mypkg:mypkg/Uneven-v0")),
    f"{HIGHWAY} --data.env_id mypkg:mypkg/Pixels-v0 --data.env_kwargs '{{}}' "
    "--trainer.default_root_dir runs/pixels": Run(
        TINY,
        noticed(
            1,
            "mypkg:mypkg/Pixels-v0",
            "MultiInputActorCritic over image 64x64x3 (Nature-CNN); discrete 4 actions",
        ),
    ),
    f"{HIGHWAY} --data.env_id mypkg:mypkg/Panel-v0 --data.env_kwargs '{{}}' "
    "--trainer.default_root_dir runs/panel": Run(
        TINY,
        noticed(
            1,
            "mypkg:mypkg/Panel-v0",
            "MultiInputActorCritic over gauges: box 4, mode: discrete 3; multidiscrete 3x3 actions",
        ),
    ),
}

#: README commands that are not run here, each with the reason.
NOT_RUN: dict[str, str] = {
    "make train": "the 12-minute main job (and a venv install); its command, `fastlight fit --config "
    "configs/highway_dpsa.yaml`, runs here",
    "make test": "the test suite itself, which runs this file",
    "torchrun --nnodes 2 --nproc_per_node 8 --node_rank $NODE_RANK --master_addr $MASTER_ADDR "
    "--master_port 29500 -m fastlight fit --config configs/vla_metaworld_mt10.yaml --trainer.strategy "
    "ddp --trainer.accelerator gpu --trainer.devices 8 --trainer.num_nodes 2": (
        "multi-node: 2 nodes x 8 GPUs (the 2-process DDP line runs here)"
    ),
    f"srun {MT10} --trainer.strategy "
    "ddp --trainer.accelerator gpu --trainer.devices 8 --trainer.num_nodes 2": (
        "a SLURM allocation of 2 nodes x 8 GPUs"
    ),
    f"{MT10} --trainer.strategy fsdp2 --trainer.accelerator gpu --trainer.devices 8 "
    "--trainer.precision bf16-mixed": (
        "8 GPUs; fsdp2 on 2 CPU ranks is tests/modules/test_fsdp2.py, on one GPU tests/modules/test_fsdp.py"
    ),
    # The Ray section runs as pasted (in its own home folder, on localhost, tiny sizes appended) in
    # tests/fleet/ray/test_ray_readme.py, which reads these commands from the README.
    **dict.fromkeys(
        [
            "export RAY_AUTH_MODE=token",
            "ray get-auth-token --generate",
            "ray start --head --port 6379 --num-cpus 0",
            "ray start --address $HEAD_ADDR:6379 --num-cpus 32 --resources '{\"sim\": 32}'",
            "fastlight fit --config configs/highway_dpsa.yaml --data.num_workers 64 --data.num_envs 256 "
            "--data.fleet.class_path fastlight.fleet.ray.fleet.RayFleet --data.fleet.init_args.address auto "
            "--data.fleet.init_args.sampler_resources '{sim: 1}'",
        ],
        "a Ray cluster: tests/fleet/ray/test_ray_readme.py runs these, as pasted, on localhost",
    ),
}

#: The package of README's "Your own env": README's own ``mypkg/__init__.py``, and an env of
#: episodes of uneven length (2 to 9 steps) for its entry point, with the same episodes over the
#: spaces README shows next (64x64 RGB frames; a Dict with a Discrete part and a MultiDiscrete action).
MYPKG_ENVS = """
import gymnasium as gym
import numpy as np


class UnevenEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left = int(self.np_random.integers(2, 10))
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

    def step(self, action):
        self.left -= 1
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), float(action), self.left == 0, False, {}


class PixelsEnv(UnevenEnv):
    observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        return self.observation_space.sample(), info

    def step(self, action):
        _, reward, terminated, truncated, info = super().step(int(action) == 0)
        return self.observation_space.sample(), reward, terminated, truncated, info


class PanelEnv(UnevenEnv):
    observation_space = gym.spaces.Dict(
        {"gauges": gym.spaces.Box(-1.0, 1.0, (4,)), "mode": gym.spaces.Discrete(3)}
    )
    action_space = gym.spaces.MultiDiscrete([3, 3])

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        return self.observation_space.sample(), info

    def step(self, action):
        assert np.shape(action) == (2,), action
        _, reward, terminated, truncated, info = super().step(float(np.sum(action)))
        return self.observation_space.sample(), reward, terminated, truncated, info
"""


def readme_python_block(marker: str) -> str:
    """The README's ```python block that contains ``marker``."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


# ---------------------------------------------------------------------- running them
def working_copy(tmp: Path) -> Path:
    for name in COPIED:
        shutil.copytree(ROOT / name, tmp / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (tmp / "mypkg").mkdir()
    (tmp / "mypkg" / "__init__.py").write_text(readme_python_block('gym.register("mypkg/'))
    (tmp / "mypkg" / "envs.py").write_text(MYPKG_ENVS)
    return tmp


def executable(command: str) -> list[str]:
    """``command`` as a user's shell runs it, ``fastlight`` and ``python`` being the venv's."""
    words = shlex.split(command)
    if words[0] in ("fastlight", "python"):
        path = BIN / words[0]
        assert path.is_file(), (
            f"{path}: the venv has no {words[0]} (pip install -e . makes the console script)"
        )
        words[0] = str(path)
    return words


def run_in_order(commands: list[str], cwd: Path, timeout: float) -> dict[str, float]:
    """Run ``commands`` (README order, ``last`` ones after the rest) in ``cwd``; seconds each."""
    env = {k: v for k, v in os.environ.items() if k != "MUJOCO_GL" and not k.startswith("PYTEST_")}
    # The venv's bin first, as an activated venv has it: a command's shell finds its torchrun.
    env["PATH"] = os.pathsep.join(p for p in (str(BIN), env.get("PATH")) if p)
    order = sorted(commands, key=lambda c: (RUN[c].last, COMMANDS.index(c)))
    seconds = {}
    for command in order:
        spec = RUN[command]
        started = time.time()
        proc = subprocess.run(
            [*executable(command), *spec.extra],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        seconds[command] = time.time() - started
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, (
            f"{command!r} + {list(spec.extra)} exited {proc.returncode}:\n{output[-4000:]}"
        )
        try:
            spec.check(Done(command, cwd, started - 1.0, output))  # mtimes have 1 s resolution on some disks
        except AssertionError as e:
            raise AssertionError(f"{command!r} + {list(spec.extra)}: {e}\n{output[-4000:]}") from e
    return seconds


def test_every_readme_command_is_run_or_listed():
    assert len(COMMANDS) >= 20, COMMANDS  # an extraction that finds nothing would pass everything below
    both = set(RUN) & set(NOT_RUN)
    assert not both, f"both run and listed as not run: {sorted(both)}"
    new = [c for c in COMMANDS if c not in RUN and c not in NOT_RUN]
    assert not new, f"README commands neither run by tests/test_readme.py (RUN) nor listed in NOT_RUN: {new}"
    stale = [c for c in [*RUN, *NOT_RUN] if c not in COMMANDS]
    assert not stale, f"tests/test_readme.py lists commands README.md no longer has: {stale}"


def test_commands_are_split_as_a_shell_reads_them():
    text = "\n".join([
        "```bash", "# a comment", "fastlight fit --a 1   # the main job", "fastlight fit --b '#x' \\",
        "  --c 2  # trailing", "```", "```python", "python -m not.shell", "```", "```console",
        "$ fastlight plot runs/x", "fastlight plot: wrote runs/x/learning_curve.png", "```",
    ])  # fmt: skip
    assert readme_commands(text) == [
        "fastlight fit --a 1",
        "fastlight fit --b '#x' --c 2",
        "fastlight plot runs/x",
    ]


@pytest.mark.slow  # 139 s on 2 cores: over make test's ~10-minute budget (make test-slow runs it)
@pytest.mark.multiproc
def test_quick_readme_commands_run(tmp_path):
    """The highway chain (fit -> evaluate -> plot -> learning check), --print_config, the Meta-World
    camera config with MUJOCO_GL unset, and a user's own env package."""
    with open(ROOT / "configs" / "vla_metaworld_reach.yaml") as f:  # camera frames: MuJoCo renders
        assert yaml.safe_load(f)["data"]["init_args"]["env_kwargs"].get("image", True) is True
    quick = [c for c in COMMANDS if c in RUN and not RUN[c].slow]
    run_in_order(quick, working_copy(tmp_path), timeout=300)


@pytest.mark.slow
@pytest.mark.multiproc
def test_slow_readme_commands_run(tmp_path):
    """The other highway variants, the VLA chain demonstrations + SFT -> RL -> evaluations, and a
    2-process DDP run (about 5 minutes on 2 cores)."""
    slow = [c for c in COMMANDS if c in RUN and RUN[c].slow and RUN[c].check is not plain_ppo]
    run_in_order(slow, working_copy(tmp_path), timeout=1200)


@pytest.mark.slow
@pytest.mark.multiproc
def test_plain_ppo_readme_commands_run(tmp_path):
    """The plain Lightning PPO project and its two fastlight steps, as pasted: 2000 optimizer steps
    each (their default; several minutes each on 2 cores)."""
    ppo = [c for c in COMMANDS if c in RUN and RUN[c].check is plain_ppo]
    assert len(ppo) == 3, ppo
    run_in_order(ppo, working_copy(tmp_path), timeout=1800)
