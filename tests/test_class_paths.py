"""Two spellings of one class path name one class (``fastlight.X`` and ``fastlight.<module>.X``)."""

from __future__ import annotations

from fastlight.callbacks.env_steps import EnvStepBudget
from fastlight.class_paths import class_key, class_path, resolve, same_class


def test_public_and_module_paths_are_the_same_class() -> None:
    assert class_path(EnvStepBudget) == "fastlight.callbacks.env_steps.EnvStepBudget"
    assert same_class("fastlight.EnvStepBudget", "fastlight.callbacks.env_steps.EnvStepBudget")
    assert class_key("fastlight.EnvStepBudget") is EnvStepBudget is resolve("fastlight.EnvStepBudget")


def test_different_or_unimportable_paths_are_not() -> None:
    assert not same_class("fastlight.EnvStepBudget", "fastlight.RolloutThroughput")
    assert not same_class("nowhere.Thing", "fastlight.EnvStepBudget")
    assert same_class("nowhere.Thing", "nowhere.Thing")  # equal strings, nothing imported
    assert not same_class(None, "fastlight.EnvStepBudget")
    assert resolve("fastlight.NoSuchName") is None and class_key("nowhere.Thing") == "nowhere.Thing"
