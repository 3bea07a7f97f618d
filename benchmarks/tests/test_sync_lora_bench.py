"""``python -m benchmarks.sync.lora`` at a tiny size: both paths and settings measured, the copies hold the
trainer's weights, LoRA sends exactly its trainable tensors, and each run appends a section to sync.md."""

from __future__ import annotations

import pytest

from benchmarks.sync import lora as bench


@pytest.mark.multiproc
@pytest.mark.slow
def test_tiny_run_appends_a_section_with_its_command(tmp_path):
    (tmp_path / "sync.md").write_text("# Weight sync\n\nearlier runs\n")
    argv = [
        "--hidden",
        "32",
        "--layers",
        "2",
        "--vocab",
        "4096",
        "--rank",
        "2",
        "--reps",
        "2",
        "--out",
        str(tmp_path),
    ]
    rows = {(r["setting"], r["path"]): r for r in bench.main(argv)["rows"]}
    assert set(rows) == {(s, p) for s in bench.SETTINGS for p in ("shared_memory", "double_buffer")}
    assert all(r["exact"] for r in rows.values())
    full, lora = (
        bench.make_policy(bench.parse_args(argv), lora=False),
        bench.make_policy(bench.parse_args(argv), lora=True),
    )
    trainable = sum(t.numel() for t in lora.parameters() if t.requires_grad)
    buffers = sum(b.numel() for b in lora.buffers() if b.is_floating_point())
    assert rows[("lora", "shared_memory")]["floats"] == trainable + buffers
    assert rows[("full", "shared_memory")]["floats"] == sum(t.numel() for t in full.parameters()) + buffers
    for path in ("shared_memory", "double_buffer"):  # float32 weights: 4 bytes a float on both paths
        assert rows[("lora", path)]["bytes"] == 4 * (trainable + buffers)
    assert 2 * trainable < sum(t.numel() for t in full.parameters())  # the 4096-row embeddings stay home
    text = (tmp_path / "sync.md").read_text()
    assert text.startswith("# Weight sync\n\nearlier runs\n")
    assert "Command: `python -m benchmarks.sync.lora --hidden 32 --layers 2" in text
    assert text.count("| shared_memory | lora |") == 1 and "| NO |" not in text


def test_flags_are_checked():
    with pytest.raises(SystemExit, match="--hidden"):
        bench.parse_args(["--hidden", "30"])
