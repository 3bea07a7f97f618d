"""Smoke test of ``python -m fastlight.bench.pruning`` at toy size (the real run is in benchmarks/results)."""

from __future__ import annotations

import json

import pytest

from fastlight.bench.pruning import main, parse_args


def test_bench_runs_and_writes_results(tmp_path) -> None:
    sizes = {
        "--hidden-size": 32, "--heads": 4, "--intermediate-size": 64, "--layers": 1, "--vocab": 2048,
        "--n-bins": 64, "--batch": 2, "--seq": 12, "--action-tokens": 3, "--steps": 2, "--warmup": 1,
    }  # fmt: skip
    argv = [s for k, v in sizes.items() for s in (k, str(v))] + ["--out", str(tmp_path)]
    result = main(argv)
    pairs = result["comparison"]
    assert [p["logits"] for p in pairs] == ["all", "action"]
    assert all(p["head_param_ratio"] == 2048 / 64 for p in pairs)
    assert all(p["adam_state_ratio"] > 1 and p["peak_step_memory_ratio"] > 1 for p in pairs)
    assert all(p["max_abs_loss_diff"] < 1e-4 for p in pairs)
    saved = json.loads((tmp_path / "pruning.json").read_text())
    assert saved["meta"]["command"].startswith("python -m fastlight.bench.pruning --hidden-size 32")
    assert "| all | 32.0 |" in (tmp_path / "pruning.md").read_text()


def test_gpu_flags_parse() -> None:
    args = parse_args(["--device", "cuda", "--dtype", "bf16"])
    assert (args.device, args.dtype) == ("cuda", "bf16")
    with pytest.raises(SystemExit):
        parse_args(["--action-tokens", "64", "--seq", "64"])
