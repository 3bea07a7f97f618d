"""``python -m fastlight.bench.vla_eval``: the statistics, the CLI's refusals, and an end-to-end run."""

from __future__ import annotations

import json
import math
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from fastlight.bench.vla_eval import (
    Policy,
    bootstrap_mean_ci,
    default_label,
    main,
    paired_diff_ci,
    resolve_env,
    split_spec,
    wilson_interval,
    write_gifs,
)
from fastlight.evaluation import TaskEpisode

ROOT = Path(__file__).resolve().parents[2]
Z = 1.959964


# ---------------------------------------------------------------------- Wilson
def test_wilson_matches_the_closed_form():
    k, n = 8, 10
    p = k / n
    centre = (p + Z**2 / (2 * n)) / (1 + Z**2 / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z**2 / (4 * n**2)) / (1 + Z**2 / n)
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(centre - half, abs=1e-12)
    assert high == pytest.approx(centre + half, abs=1e-12)
    assert (low, high) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # the textbook 8/10 interval


def test_wilson_at_zero_and_all_successes():
    low, high = wilson_interval(0, 10)
    assert low == 0.0
    assert high == pytest.approx(0.2775, abs=1e-4)  # published: 0 of 10 -> [0, 0.278]
    low, high = wilson_interval(10, 10)  # symmetric
    assert high == 1.0
    assert low == pytest.approx(1 - 0.2775, abs=1e-4)


def test_wilson_refuses_impossible_counts():
    for k, n in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError, match="wilson_interval"):
            wilson_interval(k, n)


# ---------------------------------------------------------------------- bootstrap
def _tasks(rates: list[float], n: int) -> dict[str, np.ndarray]:
    """Task -> ``n`` outcomes with exactly ``round(rate * n)`` successes, deterministic order."""
    return {f"t{i}": (np.arange(n) < round(r * n)).astype(float) for i, r in enumerate(rates)}


def test_bootstrap_of_constant_data_is_a_point():
    assert bootstrap_mean_ci(_tasks([1.0, 1.0, 1.0], 5)) == (1.0, 1.0, 1.0)
    assert bootstrap_mean_ci(_tasks([0.0, 0.0], 7)) == (0.0, 0.0, 0.0)


def test_bootstrap_ci_contains_the_mean_and_narrows_with_more_episodes():
    rates = [0.2, 0.5, 0.8, 0.6]
    mean, low, high = bootstrap_mean_ci(_tasks(rates, 10), n_boot=4000, seed=1)
    assert mean == pytest.approx(np.mean(rates))
    assert low < mean < high
    mean4, low4, high4 = bootstrap_mean_ci(_tasks(rates, 40), n_boot=4000, seed=1)
    assert mean4 == pytest.approx(mean)
    assert low4 < mean4 < high4
    # The standard error shrinks as 1/sqrt(n): 4x the episodes, about half the width.
    assert (high4 - low4) < 0.7 * (high - low)


def test_bootstrap_is_reproducible_and_task_stratified():
    data = _tasks([0.3, 0.7], 10)
    assert bootstrap_mean_ci(data, seed=3) == bootstrap_mean_ci(data, seed=3)
    # Tasks of different sizes each keep their own size: one task at 1.0 with 2 episodes, one at
    # 0.0 with 50 -> the mean over tasks is 0.5, never the pooled 2/52.
    mean, low, high = bootstrap_mean_ci({"a": np.ones(2), "b": np.zeros(50)})
    assert (mean, low, high) == (0.5, 0.5, 0.5)


def test_paired_diff_of_identical_policies_is_exactly_zero():
    a = _tasks([0.2, 0.5, 0.9], 10)
    assert paired_diff_ci(a, {k: v.copy() for k, v in a.items()}) == (0.0, 0.0, 0.0)


def test_paired_diff_of_one_extra_success_per_task_is_positive():
    n = 10
    a = _tasks([0.2, 0.5, 0.7], n)
    b = {k: v.copy() for k, v in a.items()}
    for v in b.values():
        v[np.flatnonzero(v == 0)[0]] = 1.0  # one more success per task, same seeds otherwise
    diff, low, high = paired_diff_ci(a, b, n_boot=4000)
    assert diff == pytest.approx(1 / n)
    assert 0 <= low <= diff <= high
    # Pairing matters: the unpaired intervals of the two means overlap heavily, yet the paired
    # difference is never negative (no episode got worse).
    assert paired_diff_ci(b, a, n_boot=4000)[0] == pytest.approx(-1 / n)


def test_paired_diff_refuses_unpaired_input():
    with pytest.raises(ValueError, match="different tasks"):
        paired_diff_ci({"x": np.ones(3)}, {"y": np.ones(3)})
    with pytest.raises(ValueError, match="3 episodes in a, 4 in b"):
        paired_diff_ci({"x": np.ones(3)}, {"x": np.ones(4)})


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
        TaskEpisode("reach-v3", 0, 1, True, 3, 1.0, frames=[frame, frame + 50, frame + 100]),
        TaskEpisode("reach-v3", 0, 2, False, 3, 0.0),  # not recorded
        TaskEpisode("push-v3", 1, 3, False, 2, 0.0, frames=[frame, frame]),
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
    callbacks = [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                  "init_args": {"dirpath": str(tmp / "ckpt"), "save_last": True}}]
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
    """A stand-in ``fastlight.bench.bc_baseline`` whose ``load_bc`` returns a do-nothing policy."""
    module = types.ModuleType("fastlight.bench.bc_baseline")
    calls = []

    def load_bc(path):
        calls.append(path)
        meta = json.loads(Path(path).read_text())
        return (lambda obs, step: np.zeros((len(step), 4), np.float32)), meta

    module.load_bc = load_bc
    monkeypatch.setitem(sys.modules, "fastlight.bench.bc_baseline", module)
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
    assert "vla_eval --ckpt a=" in text  # the command line
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

