"""The plain-MLP behaviour-cloning baseline (benchmarks.vla.bc_baseline): training, save/load, CLI."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from benchmarks.vla.bc_baseline import (
    MLPBehaviourCloning,
    instruction_lookup,
    load_bc,
    main,
    parse_args,
    save_bc,
    train_bc,
)
from fastlight.vla.demos import Demos

ENV_KWARGS = {"tasks": "reach-v3", "image": False, "max_path_length": 50}


@pytest.fixture(autouse=True)
def one_thread():
    # A small MLP on a shared 2-core machine runs ~10x slower with 2 contending torch threads.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_demos(n_tasks: int = 3, per_task: int = 200, proprio_dim: int = 39, seed: int = 0) -> Demos:
    """Hand-built demos: actions a per-task smooth function of proprio; one instruction row per task."""
    g = torch.Generator().manual_seed(seed)
    n = n_tasks * per_task
    task_id = torch.arange(n_tasks).repeat_interleave(per_task)
    proprio = torch.randn(n, proprio_dim, generator=g)
    weights = torch.randn(n_tasks, proprio_dim, 4, generator=g) / math.sqrt(proprio_dim)
    actions = torch.tanh(torch.einsum("np,npa->na", proprio, weights[task_id]))
    rows = torch.stack([torch.tensor([2, 10 + k, 3, 7, 0, 0]) for k in range(n_tasks)])
    ids = rows[task_id]
    return Demos(
        obs={"proprio": proprio, "instruction_ids": ids, "instruction_mask": (ids > 0).long()},
        actions=actions,
        rewards=torch.zeros(n),
        step=torch.arange(n) % per_task,
        task_id=task_id,
        episode=task_id.clone(),
        task_names=tuple(f"task{k}-v3" for k in range(n_tasks)),
    )


def obs_batch(demos: Demos, idx: list[int]) -> dict[str, np.ndarray]:
    return {k: v[idx].numpy() for k, v in demos.obs.items()}


def test_forward_shapes_and_range():
    model = MLPBehaviourCloning(39, 10, 4)
    out = model(torch.randn(5, 39) * 100, torch.tensor([0, 3, 9, 9, 1]))
    assert out.shape == (5, 4)
    assert out.abs().max() <= 1.0
    assert [m.out_features for m in model.net if isinstance(m, torch.nn.Linear)] == [256, 256, 4]


def test_training_drives_the_mse_down_and_is_seeded():
    demos = tiny_demos()
    model, stats = train_bc(demos, time_budget_s=math.inf, max_steps=300, seed=0)
    assert stats["steps"] == 300
    # Measured: initial ~0.15, final ~1e-3 after 300 steps (Adam 1e-3, batch 256); 0.2x is a wide margin.
    assert stats["final_loss"] < 0.2 * stats["initial_loss"], stats
    again, _ = train_bc(demos, time_budget_s=math.inf, max_steps=300, seed=0)
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=k)


def test_time_budget_stops_training():
    _, stats = train_bc(tiny_demos(per_task=20), time_budget_s=0.5, seed=0)
    assert stats["steps"] >= 1 and stats["seconds"] < 5


def test_save_load_round_trip_and_unknown_instruction(tmp_path):
    demos = tiny_demos()
    model, stats = train_bc(demos, time_budget_s=math.inf, max_steps=20, seed=1)
    path = tmp_path / "sub" / "bc.pt"
    save_bc(path, model, demos, env_id="fastlight/MetaWorld-v0", env_kwargs=ENV_KWARGS, stats=stats)
    assert [p.name for p in path.parent.iterdir()] == ["bc.pt"]  # no temporary left behind
    act, meta = load_bc(path)
    assert meta["env_id"] == "fastlight/MetaWorld-v0" and meta["env_kwargs"] == ENV_KWARGS
    assert meta["task_names"] == demos.task_names and meta["demos_per_task"] == 1
    assert meta["stats"]["steps"] == 20

    idx = [0, 250, 599, 10]  # tasks 0, 1, 2, 0
    obs = obs_batch(demos, idx)
    expected = model(demos.obs["proprio"][idx], demos.task_id[idx]).detach().numpy()
    got = act(obs, np.zeros(len(idx), dtype=np.int64))
    assert got.shape == (4, 4) and got.dtype == np.float32
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(expected), atol=0, rtol=0)
    # The step is not an input of this policy.
    again = act(obs, np.arange(4))
    torch.testing.assert_close(torch.from_numpy(again), torch.from_numpy(got), atol=0, rtol=0)

    obs["instruction_ids"][2] = [2, 99, 3, 7, 0, 0]
    with pytest.raises(ValueError, match="unknown instruction ids"):
        act(obs, np.zeros(len(idx), dtype=np.int64))


def test_instruction_shared_by_two_tasks_is_refused():
    demos = tiny_demos()
    demos.obs["instruction_ids"][demos.task_id == 1] = demos.obs["instruction_ids"][0].clone()
    with pytest.raises(ValueError, match="ambiguous"):
        instruction_lookup(demos)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--time", "0"], "--time"),
        (["--time", "-3"], "--time"),
        (["--demos-per-task", "0"], "--demos-per-task"),
        (["--max-steps", "0"], "--max-steps"),
        (["--config", "no/such/config.yaml"], "--config"),
    ],
)
def test_bad_flags_exit_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert flag in capsys.readouterr().err


def test_config_defaults(tmp_path):
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("seed_everything: 7\ndata:\n  init_args:\n    seed: 3\n"
                   "    env_kwargs: {tasks: reach-v3}\n")
    args, init_args = parse_args(["--config", str(cfg)])
    assert args.seed == 7 and init_args == {"seed": 3, "env_kwargs": {"tasks": "reach-v3"}}
    assert parse_args(["--config", str(cfg), "--seed", "1"])[0].seed == 1


def test_cli_end_to_end_on_reach(tmp_path, capsys):
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(
        "data:\n  class_path: fastlight.vla.demos.DemoDataModule\n  init_args:\n"
        f"    env_kwargs: {ENV_KWARGS}\n    num_workers: 0\n".replace("'", "")
    )
    out = tmp_path / "bc.pt"
    stats = main(["--config", str(cfg), "--demos-per-task", "2", "--time", "30", "--max-steps", "50",
                  "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--eval-episodes", "1",
                  "--eval-batch", "1"])
    printed = capsys.readouterr().out
    assert "50 steps" in printed and "mean success" in printed and "reach-v3" in printed
    act, meta = load_bc(out)
    assert meta["env_kwargs"] == ENV_KWARGS and meta["demos_per_task"] == 2
    assert meta["stats"]["eval"]["episodes_per_task"] == 1 and stats["steps"] == 50
