"""Env ids: gymnasium's registry, fastlight's own ids, and a user's package named with module:id."""

from __future__ import annotations

import pytest

from fastlight.envs.registry import check_env_id


def test_own_namespaced_id_points_at_the_module_syntax() -> None:
    match = r"--data.env_id must be .*'mytask/Uneven-v0'.*mytask:mytask/Uneven-v0"
    with pytest.raises(ValueError, match=match):
        check_env_id("mytask/Uneven-v0")


def test_module_syntax_imports_the_registering_module() -> None:
    check_env_id("tests.fake_envs:FixedLength-v0")  # registered by importing tests.fake_envs
    with pytest.raises(ValueError, match=r"cannot import module 'nosuchpkg' named before ':'"):
        check_env_id("nosuchpkg:nosuchpkg/Env-v0")


def _needs_old_mujoco(**kwargs):
    raise ImportError("`Old-v4` is only supported on `mujoco<3`")


def test_an_env_that_refuses_its_dependencies_is_one_line_naming_the_flag() -> None:
    """gymnasium raises ImportError for an env whose dependency is missing or too new (Pusher-v4 on
    mujoco 3): the line names the flag, the id and gymnasium's reason."""
    import gymnasium as gym

    from fastlight.envs.registry import make_env

    gym.register("FastlightTestOld-v4", entry_point=_needs_old_mujoco)
    try:
        with pytest.raises(
            ValueError, match=r"^--data.env_id FastlightTestOld-v4: `Old-v4` is only supported on"
        ):
            make_env("FastlightTestOld-v4")
    finally:
        gym.registry.pop("FastlightTestOld-v4")
