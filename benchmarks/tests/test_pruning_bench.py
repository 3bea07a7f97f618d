"""``python -m benchmarks.pruning`` at toy size: the measurements themselves are checked against
analytic counts (head and model sizes, Adam state, memory lower bounds) and the full and pruned
heads must optimise the same loss. The real run is in benchmarks/results."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import pruning as bench

V, D, N, LAYERS, INTER = 2048, 32, 64, 1, 64
B, S, K, STEPS = 2, 12, 3, 2
SIZES = {
    "--hidden-size": D, "--heads": 4, "--intermediate-size": INTER, "--layers": LAYERS, "--vocab": V,
    "--n-bins": N, "--batch": B, "--seq": S, "--action-tokens": K, "--steps": STEPS, "--warmup": 1,
}  # fmt: skip
ARGV = [s for k, v in SIZES.items() for s in (k, str(v))]
FP32 = 4  # bytes


def llama_params(head_rows: int) -> int:
    """Parameters of build_llama(V, D, LAYERS, heads, INTER) with a ``head_rows x D`` output head."""
    layer = 4 * D * D + 3 * D * INTER + 2 * D  # q, k, v, o; gate, up, down; two RMSNorms
    return V * D + LAYERS * layer + D + head_rows * D  # embeddings, layers, final norm, head


@pytest.fixture(scope="module")
def measured():
    """The four variants after the interleaved timed steps, and their summaries (as ``main`` does)."""
    args = bench.parse_args(ARGV)
    variants = bench.build_variants(args)
    bench.time_interleaved(variants, args)
    rows = [bench.summarise(v, args) for v in variants]
    return args, variants, rows


def test_variants_are_full_and_pruned_pairs_per_logits_setting(measured) -> None:
    _, variants, rows = measured
    assert [(v.pruned, v.logits_to_keep) for v in variants] == [(False, 0), (True, 0), (False, K), (True, K)]
    for v, r in zip(variants, rows, strict=True):
        rows_expected = N if v.pruned else V
        assert tuple(v.model.get_output_embeddings().weight.shape) == (rows_expected, D)
        assert r["head_params"] == rows_expected * D
        assert r["total_params"] == llama_params(rows_expected)
        assert len(r["step_times_s"]) == len(r["losses"]) == STEPS  # warm-up steps are not recorded


def test_full_and_pruned_heads_optimise_the_same_loss(measured) -> None:
    _, variants, rows = measured
    for full, pruned in ((variants[0], variants[1]), (variants[2], variants[3])):
        # Same weights, same batches: only rounding may differ (fp32, loss ~ 4).
        assert full.losses == pytest.approx(pruned.losses, abs=1e-5)
        # The loss is a cross-entropy over the N action bins, not over the V-token vocabulary:
        # a near-uniform random head gives ~ln N (4.16), not ln V (7.62).
        assert abs(full.losses[0] - math.log(N)) < 0.5
        # After the same Adam steps the pruned head still equals the full head's action rows.
        torch.testing.assert_close(
            pruned.model.get_output_embeddings().weight,
            full.model.get_output_embeddings().weight[V - N :],
            atol=1e-6,
            rtol=0,
        )
    # logits_to_keep changes where logits are computed, not the loss.
    assert variants[0].losses == pytest.approx(variants[2].losses, abs=1e-5)


def test_memory_counts_match_the_tensors(measured) -> None:
    _, variants, rows = measured
    for v, r in zip(variants, rows, strict=True):
        params = llama_params(N if v.pruned else V)
        n_tensors = len(list(v.model.parameters()))
        assert r["param_bytes"] == FP32 * params
        # Adam: exp_avg and exp_avg_sq per parameter, plus one fp32 ``step`` scalar per tensor.
        assert r["adam_state_bytes"] == 2 * FP32 * params + FP32 * n_tensors
        assert r["peak_step_bytes"] == r["param_bytes"] + r["adam_state_bytes"] + r["transient_peak_bytes"]
        # One step must at least hold the head's gradient ...
        head_rows = N if v.pruned else V
        assert r["transient_peak_bytes"] >= FP32 * head_rows * D
        # ... and, with logits at every position, the [B, S, V or N] logits.
        if v.logits_to_keep == 0:
            assert r["transient_peak_bytes"] >= FP32 * B * S * head_rows


def test_comparison_ratios_are_the_analytic_values(measured) -> None:
    _, variants, rows = measured
    pairs = bench.compare(rows)
    assert [p["logits"] for p in pairs] == ["all", "action"]
    n_tensors = len(list(variants[0].model.parameters()))
    for p in pairs:
        assert p["head_param_ratio"] == V / N
        assert p["total_param_ratio"] == pytest.approx(llama_params(V) / llama_params(N), rel=1e-12)
        adam = (2 * llama_params(V) + n_tensors) / (2 * llama_params(N) + n_tensors)
        assert p["adam_state_ratio"] == pytest.approx(adam, rel=1e-12)
        assert p["peak_step_memory_ratio"] > 1
        assert p["max_abs_loss_diff"] < 1e-5


def test_compare_on_hand_made_rows() -> None:
    def row(keep, head, total, adam, peak, step_s, losses):
        return {"logits_to_keep": keep, "head_params": head, "total_params": total, "adam_state_bytes": adam,
                "peak_step_bytes": peak, "median_step_s": step_s, "losses": losses}  # fmt: skip

    rows = [row(0, 400, 1000, 80, 300, 2.0, [1.0, 2.0]), row(0, 100, 700, 20, 100, 0.5, [1.5, 1.75]),
            row(5, 400, 1000, 80, 200, 1.0, [3.0]), row(5, 100, 700, 40, 100, 1.0, [3.0])]  # fmt: skip
    a, b = bench.compare(rows)
    assert a == {"logits": "all", "head_param_ratio": 4.0, "total_param_ratio": 1000 / 700,
                 "adam_state_ratio": 4.0, "peak_step_memory_ratio": 3.0, "median_step_speedup": 4.0,
                 "max_abs_loss_diff": 0.5}  # fmt: skip
    assert (b["logits"], b["adam_state_ratio"], b["median_step_speedup"], b["max_abs_loss_diff"]) == (
        "action", 2.0, 1.0, 0.0)  # fmt: skip
    with pytest.raises(ValueError):  # losses of unequal length are a bug, not a shorter comparison
        bench.compare([rows[0], row(0, 100, 700, 20, 100, 0.5, [1.5])])


def test_batch_holds_text_then_action_ids() -> None:
    args = bench.parse_args(ARGV)
    ids, bins = bench.make_batch(args, 3)
    assert ids.shape == (B, S) and bins.shape == (B, K)
    assert bool((ids[:, : S - K] < V - N).all())  # text ids never hit the action range
    assert torch.equal(ids[:, -K:], bins + (V - N))  # the last K ids are the target bins
    assert bool((bins >= 0).all() and (bins < N).all())
    assert torch.equal(bench.make_batch(args, 3)[0], ids)  # the same batch for every variant
    assert not torch.equal(bench.make_batch(args, 4)[0], ids)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--action-tokens", "64", "--seq", "64"], "--action-tokens must be in [1, --seq=64), got 64"),
        (["--action-tokens", "0"], "--action-tokens must be in [1, --seq=64), got 0"),
        (["--n-bins", "1"], "--n-bins must be in [2, --vocab=32000], got 1"),
        (["--n-bins", "300", "--vocab", "256"], "--n-bins must be in [2, --vocab=256], got 300"),
        (["--steps", "0"], "--steps must be >= 1 and --warmup >= 0, got 0 and 3"),
        (["--warmup", "-1"], "--steps must be >= 1 and --warmup >= 0, got 20 and -1"),
        (["--dtype", "fp64"], "argument --dtype: invalid choice: 'fp64'"),
        (["--logits", "some"], "argument --logits: invalid choice: 'some'"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults_and_gpu_flags() -> None:
    args = bench.parse_args(["--device", "cuda", "--dtype", "bf16"])
    assert (args.device, bench.DTYPES[args.dtype]) == ("cuda", torch.bfloat16)
    d = bench.parse_args([])
    assert (d.vocab, d.n_bins, d.hidden_size, d.logits, d.dtype) == (32000, 256, 512, "both", "fp32")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_cuda_is_refused() -> None:
    with pytest.raises(SystemExit, match="--device cuda requested but CUDA is not available"):
        bench.main(["--device", "cuda"])


def test_main_writes_the_report_it_returns(tmp_path) -> None:
    result = bench.main([*ARGV, "--logits", "action", "--out", str(tmp_path)])
    assert [p["logits"] for p in result["comparison"]] == ["action"]  # --logits action: one pair
    names = [v["name"] for v in result["variants"]]
    assert names == ["full head, logits=action", "pruned head, logits=action"]
    saved = json.loads((tmp_path / "pruning.json").read_text())
    assert saved == json.loads(json.dumps(result))
    assert saved["meta"]["command"] == "python -m benchmarks.pruning " + " ".join(
        [*ARGV, "--logits", "action", "--out", str(tmp_path)]
    )
    md = (tmp_path / "pruning.md").read_text()
    assert f"`{saved['meta']['command']}`" in md
    assert f"| full head, logits=action | {V * D:,} | {llama_params(V):,} |" in md
    assert f"| pruned head, logits=action | {N * D:,} | {llama_params(N):,} |" in md
    assert f"| action | {V / N:.1f} | {llama_params(V) / llama_params(N):.2f} |" in md
