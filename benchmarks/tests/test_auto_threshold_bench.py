"""``benchmarks.sampling.auto_threshold``: a tiny run writes a row per setting with the measured figures."""

from __future__ import annotations

import json

from benchmarks.sampling.auto_threshold import UnevenEnv, main


def test_uneven_env_draws_both_lengths():
    env = UnevenEnv()
    lengths = set()
    for seed in range(40):
        env.reset(seed=seed)
        lengths.add(env.length)
    assert lengths == {3, 200}


def test_tiny_run_writes_every_setting(tmp_path):
    main(["--env", "uneven", "--envs", "4", "--rounds", "1", "--seconds", "0.3", "--reset-cost", "0.01",
          "--out", str(tmp_path)])  # fmt: skip
    result = json.loads((tmp_path / "auto_threshold.json").read_text())["results"][0]
    settings = [row["setting"] for row in result["rows"]]
    assert settings == ["0.250", "0.500", "0.750", "1.000", "auto"]
    for row in result["rows"]:
        assert row["cycles"] >= 1 and row["valid_steps"] > 0 and row["effective_tps"] > 0
        assert 0.0 <= row["cut_share"] <= 1.0
    # The fixed thresholds ran at their own value every cycle.
    for row in result["rows"][:-1]:
        assert row["mean_threshold"] == float(row["setting"])
    assert "auto / best allowed fixed" in (tmp_path / "auto_threshold.md").read_text()
