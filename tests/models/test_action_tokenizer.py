"""ActionTokenizer: bins, bin centres and the last-n_bins token-id convention (AcceRL / OpenVLA)."""

from __future__ import annotations

import pytest
import torch

from fastlight.models.action_tokenizer import ActionTokenizer


@pytest.mark.parametrize(("n_bins", "low", "high"), [(256, -1.0, 1.0), (7, -2.0, 3.0), (2, 0.0, 1.0)])
def test_round_trip_within_half_a_bin(n_bins: int, low: float, high: float) -> None:
    tok = ActionTokenizer(vocab_size=1000, n_bins=n_bins, low=low, high=high)
    actions = torch.rand(64, 5) * (high - low) + low
    actions[0, :2] = torch.tensor([low, high])
    bins = tok.encode(actions)
    assert bins.shape == actions.shape and bins.dtype == torch.long
    assert int(bins.min()) >= 0 and int(bins.max()) < n_bins
    err = (tok.decode(bins) - actions).abs().max()
    assert float(err) <= tok.bin_width / 2 + 1e-6


def test_out_of_range_actions_are_clipped() -> None:
    tok = ActionTokenizer(vocab_size=1000, n_bins=256)
    bins = tok.encode(torch.tensor([-5.0, -1.0, 1.0, 7.0]))
    assert bins.tolist() == [0, 0, 255, 255]
    dec = tok.decode(bins)
    assert float(dec.min()) >= -1.0 and float(dec.max()) <= 1.0


def test_token_ids_are_the_last_n_bins() -> None:
    tok = ActionTokenizer(vocab_size=32000, n_bins=256)
    assert (tok.first_id, tok.last_id) == (32000 - 256, 32000)
    with pytest.raises(ValueError, match="bins must be in"):
        tok.decode(torch.tensor([256]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"vocab_size": 100, "n_bins": 1}, "n_bins"),
        ({"vocab_size": 100, "n_bins": 101}, "n_bins"),
        ({"vocab_size": 100, "n_bins": 8, "low": 1.0, "high": 1.0}, "low"),
    ],
)
def test_bad_settings_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ActionTokenizer(**kwargs)


def test_nan_actions_raise() -> None:
    with pytest.raises(ValueError, match="NaN"):
        ActionTokenizer(100, 8).encode(torch.tensor([0.0, float("nan")]))
