"""``python -m benchmarks.vla.flow_cost`` at its smallest: every setting measured, and the forward hooks count
one prefix and ``num_steps`` expert passes per ``act`` call."""

from __future__ import annotations

from benchmarks.vla import flow_cost as bench


def test_smallest_run_counts_one_prefix_and_k_expert_passes_per_call(tmp_path):
    argv = ["--batch", "2", "--reps", "1", "--warmup", "1", "--env-steps", "4", "--rounds", "1",
            "--out", str(tmp_path / "flow")]  # fmt: skip
    result = bench.main(argv)
    combos = bench.settings([10, 4], [8, 1])
    for part in ("policy_cost", "end_to_end"):
        assert set(result[part]["rows"]) == {bench.name(k, h) for k, h in combos}
    for k, h in combos:
        row = result["policy_cost"]["rows"][bench.name(k, h)]
        assert (row["prefix_forwards_per_call"], row["expert_forwards_per_call"]) == (1, k)
        assert row["counted_matches"] and row["forwards_per_env_step"] == round((1 + k) / h, 4)
        assert result["end_to_end"]["rows"][bench.name(k, h)]["env_steps"] >= 4
    policy_rows, e2e_rows = (part.split("\n\n")[1] for part in result["table"].split("End to end")[:2])
    for rows in (policy_rows, e2e_rows):
        lines = [line for line in rows.splitlines() if line.startswith("| ") and line[2].isdigit()]
        assert sorted(tuple(map(int, line.split("|")[1:3])) for line in lines) == sorted(combos)
    assert (tmp_path / "flow.json").is_file()
