"""The typed interfaces between parts are checked by attribute access, on every Python the package takes:
from 3.12 ``isinstance`` against a runtime-checkable protocol looks members up statically, and misses
what ``nn.Module.__getattr__`` serves (a LightningModule's ``policy``), which refused every RLModule with
``WeightSync`` there (seen on Python 3.12 with torch 2.11)."""

from __future__ import annotations

import inspect

import pytest
from torch import nn

from fastlight.data.protocols import RolloutPolicyModule, TrainsPolicy, implements, require
from fastlight.modules.rl_module import RLModule


class _Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.policy = nn.Linear(2, 2)  # served by nn.Module.__getattr__, not in __dict__
        self.policy_version = 0
        self.optimizer_steps_per_update = 4


def test_submodule_members_count_as_present() -> None:
    holder = _Holder()
    assert "policy" not in vars(holder)
    with pytest.raises(AttributeError):
        inspect.getattr_static(holder, "policy")  # what Python 3.12's isinstance looks at
    assert implements(holder, RolloutPolicyModule) and implements(holder, TrainsPolicy)
    require(holder, TrainsPolicy, who="WeightSync", what="a LightningModule")
    module = RLModule(obs_dim=3, action_dim=2)
    module.configure_model()
    assert implements(module, TrainsPolicy)


def test_a_missing_member_is_named() -> None:
    holder = _Holder()
    del holder.optimizer_steps_per_update
    assert implements(holder, RolloutPolicyModule) and not implements(holder, TrainsPolicy)
    assert not implements(None, RolloutPolicyModule)
    with pytest.raises(TypeError, match="the run has _Holder, which lacks optimizer_steps_per_update$"):
        require(holder, TrainsPolicy, who="WeightSync", what="a LightningModule")
