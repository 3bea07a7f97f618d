"""``python -m benchmarks.vla.eval``: the CLI's refusals and an end-to-end run (its statistics:
tests/stats)."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from benchmarks.vla.eval import (
    Policy,
    default_label,
    main,
    resolve_env,
    split_spec,
    write_gifs,
)
from fastlight.rollout import EpisodeRecord

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------- CLI pieces
def test_label_specs():
    assert split_spec("sft=runs/a/last.ckpt") == ("sft", "runs/a/last.ckpt")
    assert split_spec("runs/a/last.ckpt") == (None, "runs/a/last.ckpt")
    assert split_spec("runs/x/epoch=3-step=10.ckpt") == (None, "runs/x/epoch=3-step=10.ckpt")
    assert default_label("runs/vla_sft/tb/version_0/checkpoints/last.ckpt") == "vla_sft"
    assert default_label("runs/bc_mt10.pt") == "bc_mt10"


def _policy(label: str, **kwargs) -> Policy:
    return Policy(label, f"{label}.ckpt", "VLA", "--ckpt", "fastlight/MetaWorld-v0", kwargs)


def test_resolve_env_refuses_different_settings_unless_overridden():
    a, b = _policy("a", tasks="MT10", image=False), _policy("b", tasks="MT10", image=True)
    with pytest.raises(ValueError, match=r"a and b .*image: False vs True"):
        resolve_env([a, b], None)
    want = ("fastlight/MetaWorld-v0", {"tasks": "MT10", "image": True})
    assert resolve_env([a, b], {"image": True}) == want
    c = Policy("c", "c.pt", "MLP", "--mlp", "fastlight/MetaWorld-reach-v3", {"tasks": "MT10", "image": False})
    with pytest.raises(ValueError, match=r"a and c .*env_id"):
        resolve_env([a, c], None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ckpt", "x.ckpt", "--episodes-per-task", "0"], "--episodes-per-task must be >= 1"),
        (["--ckpt", "a=x.ckpt", "--ckpt", "b=y.ckpt", "--diff", "a:c"], "--diff: unknown label 'c'"),
        (["--ckpt", "a=x.ckpt", "--mlp", "a=y.pt"], "--mlp: duplicate label 'a'"),
        (["--ckpt", "a=/nonexistent/x.ckpt"], r"--ckpt: no checkpoint file at /nonexistent/x\.ckpt"),
        (["--mlp", "a=/nonexistent/y.pt"], r"--mlp: no BC baseline file at /nonexistent/y\.pt"),
        (["--ckpt", "x.ckpt", "--env-kwargs", "[1]"], "--env-kwargs: expected a JSON object"),
        ([], "at least one --ckpt or --mlp"),
    ],
)
def test_bad_input_names_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_unreadable_checkpoint_names_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    bad.write_text("not a checkpoint")
    with pytest.raises(SystemExit):
        main(["--ckpt", str(bad)])
    assert f"--ckpt: {bad} is not a readable checkpoint" in capsys.readouterr().err


def test_write_gifs_one_per_task(tmp_path):
    pytest.importorskip("imageio")
    frame = np.zeros((8, 8, 3), np.uint8)
    eps = [
        EpisodeRecord(
            3, 1.0, True, False, 0, True, task="reach-v3", seed=1, frames=[frame, frame + 50, frame + 100]
        ),
        EpisodeRecord(3, 0.0, False, True, 0, False, task="reach-v3", seed=2),  # not recorded
        EpisodeRecord(2, 0.0, False, True, 1, False, task="push-v3", seed=3, frames=[frame, frame]),
    ]
    paths = write_gifs(tmp_path / "v", "sft", eps)
    assert [Path(p).name for p in paths] == ["sft_reach-v3.gif", "sft_push-v3.gif"]
    import imageio.v3 as iio

    assert iio.imread(paths[0], index=None).shape == (3, 8, 8, 3)


# ---------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> Path:
    """A 2-step SFT checkpoint on reach-v3 with 10-step episodes (the env settings it records)."""
    from fastlight.cli import cli_main

    tmp = tmp_path_factory.mktemp("vla_eval")
    # Replace the config's callback list so the checkpoint lands in a known place. Short episodes
    # keep the evaluation fast; the expert cannot finish in
    # 10 steps, hence successful_only false.
    callbacks = [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": str(tmp / "ckpt"), "save_last": True},
        }
    ]
    cli_main(
        ["fit", "--config", str(ROOT / "configs/vla_metaworld_mt10_sft.yaml"),
         "--data.demos_per_task", "1", "--data.num_workers", "0", "--data.cache_dir", str(tmp / "c"),
         "--data.env_kwargs.tasks", "reach-v3", "--data.env_kwargs.max_path_length", "10",
         "--data.successful_only", "false", "--trainer.callbacks", json.dumps(callbacks),
         "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp / "r"),
         "--trainer.enable_progress_bar", "false"]
    )  # fmt: skip
    # (PreemptionCheckpoint, on by default, also keeps <root>/checkpoints/last.ckpt)
    found = tmp / "ckpt" / "last.ckpt"
    assert found.is_file(), sorted(tmp.rglob("*.ckpt"))
    return found


def _recorded_env(ckpt: Path) -> dict:
    """The checkpoint's env settings (what a BC baseline trained on the same demos records)."""
    from fastlight.checkpoints import read_checkpoint

    data = read_checkpoint(ckpt)["datamodule_hyper_parameters"]
    return {"env_id": data["env_id"], "env_kwargs": data["env_kwargs"]}


@pytest.fixture
def fake_bc(monkeypatch):
    """A stand-in ``benchmarks.vla.bc_baseline`` whose ``load_bc`` returns a do-nothing policy."""
    module = types.ModuleType("benchmarks.vla.bc_baseline")
    calls = []

    def load_bc(path):
        calls.append(path)
        meta = json.loads(Path(path).read_text())
        return (lambda obs, step: np.zeros((len(step), 4), np.float32)), meta

    module.load_bc = load_bc
    monkeypatch.setitem(sys.modules, "benchmarks.vla.bc_baseline", module)
    return calls


def test_end_to_end(tiny_ckpt, fake_bc, tmp_path, capsys):
    notes = tmp_path / "notes.md"
    notes.write_text("Hand-written *notes*.\n")
    bc = tmp_path / "bc.json"
    bc.write_text(json.dumps({
        **_recorded_env(tiny_ckpt), "task_names": ["reach-v3"], "demos_per_task": 1,
        "stats": {"expert": {"reach-v3": {"attempts": 2, "successes": 1, "kept": 1}}},
    }))  # fmt: skip
    out = tmp_path / "rep"
    result = main(
        ["--ckpt", f"a={tiny_ckpt}", "--ckpt", f"b={tiny_ckpt}", "--mlp", f"bc={bc}",
         "--episodes-per-task", "2", "--out", str(out), "--notes", str(notes), "--video", str(tmp_path / "v"),
         "--n-boot", "2000"]
    )  # fmt: skip
    md, js = out.with_name("rep.md"), out.with_name("rep.json")
    assert md.is_file() and js.is_file()
    assert "no camera frames to record" in capsys.readouterr().err  # state mode: --video explains
    assert not (tmp_path / "v").exists()

    data = json.loads(js.read_text())
    assert data["env"]["env_kwargs"]["max_path_length"] == 10  # from the checkpoint itself
    for label in ("a", "b", "bc"):
        eps = [e for e in data["episodes"] if e["policy"] == label]
        assert len(eps) == 2
        assert set(eps[0]) >= {"task", "seed", "success", "length", "return"}
    seeds = lambda lb: [e["seed"] for e in data["episodes"] if e["policy"] == lb]  # noqa: E731
    assert seeds("a") == seeds("b") == seeds("bc")  # paired
    ab, abc = data["diffs"]
    assert (ab["a"], ab["b"], abc["b"]) == ("a", "b", "bc")  # default: every policy against the first
    assert (ab["diff"], ab["ci_low"], ab["ci_high"]) == (0.0, 0.0, 0.0)  # identical checkpoints
    assert not ab["excludes_zero"]
    assert data["policies"][0]["meta"]["global_step"] == 2
    assert data["policies"][2]["kind"] == "MLP"
    assert fake_bc == [str(bc)]
    assert result["summary"]["a"] == data["summary"]["a"]

    text = md.read_text()
    assert "python -m benchmarks.vla.eval --ckpt a=" in text  # the command line
    assert "| reach-v3 |" in text and "mean over 1 tasks" in text and "mean episode length" in text
    assert "| b - a | +0.000 | [+0.000, +0.000] | no |" in text
    assert "| bc | MLP |" in text and "1/2 (50%)" in text  # expert stats from the BC metadata
    assert text.rstrip().endswith("Hand-written *notes*.")


def test_different_env_settings_are_refused(tiny_ckpt, fake_bc, tmp_path, capsys):
    bc = tmp_path / "bc.json"
    env = _recorded_env(tiny_ckpt)
    bc.write_text(json.dumps({**env, "env_kwargs": {**env["env_kwargs"], "max_path_length": 150}}))
    with pytest.raises(SystemExit):
        main(["--ckpt", f"a={tiny_ckpt}", "--mlp", f"bc={bc}", "--out", str(tmp_path / "rep")])
    want = "a and bc were trained on different env settings (max_path_length: 10 vs 150)"
    assert want in capsys.readouterr().err
    assert not (tmp_path / "rep.md").exists()


def test_group_outcomes_compares_clips_from_one_initial_state(tiny_ckpt, capsys):
    """benchmarks.vla.group_outcomes: one row per group and cycle, the clips of a group start alike."""
    from benchmarks.vla import group_outcomes

    rows = group_outcomes.main(
        ["--ckpt", str(tiny_ckpt), "--task", "reach-v3", "--groups", "2", "--group-size", "2",
         "--cycles", "2", "--max-path-length", "6"]
    )  # fmt: skip
    assert [(r["cycle"], r["group"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(len(r["success"]) == len(r["length"]) == 2 for r in rows)
    assert all(1 <= n <= 6 for r in rows for n in r["length"])
    assert "groups had both successes and failures" in capsys.readouterr().out
