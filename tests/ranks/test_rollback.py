"""RollbackPoint's pieces: the keys an update can change, and host copies that reuse their buffers
(no allocation after the first update) yet never alias the live tensors. End to end (a survivor's
checkpoint after a loss in the middle of an update): tests/faults/test_lost_rank.py."""

from __future__ import annotations

import torch
from torch import nn

from fastlight.ranks.rollback import RollbackPoint, _host_copy, _nbytes


def test_changing_keys_are_trainable_parameters_and_buffers():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    net[0].weight.requires_grad_(False)  # frozen: an update cannot change it
    assert RollbackPoint.changing_keys(net) == {
        "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked",
        "2.weight", "2.bias",
    }  # fmt: skip


def test_host_copies_reuse_their_buffers_and_do_not_alias():
    live = {
        "w": torch.randn(5, 3),
        "state": [{"step": torch.tensor(3.0), "exp_avg": torch.randn(5)}],
        "lr": 0.1,
    }
    first = _host_copy(live)
    buffers = (first["w"].data_ptr(), first["state"][0]["exp_avg"].data_ptr())
    assert first["w"].data_ptr() != live["w"].data_ptr()  # a copy, not a view
    torch.testing.assert_close(first["w"], live["w"], rtol=0, atol=0)
    live["w"].add_(1.0)  # the update changes the live tensors...
    assert not torch.equal(first["w"], live["w"])  # ...not the copy
    second = _host_copy(live, first)
    assert (second["w"].data_ptr(), second["state"][0]["exp_avg"].data_ptr()) == buffers  # reused
    assert torch.equal(second["w"], live["w"]) and second["lr"] == 0.1
    grown = _host_copy({"w": torch.randn(6, 3)}, second)  # a new shape: a new buffer
    assert grown["w"].shape == (6, 3) and grown["w"].data_ptr() != buffers[0]
    assert _nbytes(live) == (15 + 1 + 5) * 4
