"""EngineConfig validation: every bad value names the field and what is accepted."""

from __future__ import annotations

import math

import pytest

from pytest_shutdown.engine.config import EngineConfig

NUMBER_FIELDS = [
    "shutdown_timeout",
    "rocm_process_grace_s",
    "child_exit_grace_s",
    "default_process_timeout_s",
    "startup_timeout_s",
    "teardown_delay_s",
    "step_delay_s",
]
INT_FIELDS = [
    "renderer_num_workers",
    "mm_cache_size",
    "vocab_size",
    "hidden_size",
    "kv_cache_bytes",
    "data_parallel_size",
]


def test_defaults() -> None:
    config = EngineConfig()
    assert config.shutdown_timeout == 0.0
    assert (config.rocm_process_grace_s, config.child_exit_grace_s) == (15.0, 5.0)
    assert config.default_process_timeout_s == 5.0
    assert config.renderer_num_workers == 2 and config.data_parallel_size == 1
    assert config.start_method == "forkserver"
    assert config.device == "cpu"  # this machine has no GPU


@pytest.mark.parametrize("name", NUMBER_FIELDS)
@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf, "3", True])
def test_bad_numbers_name_the_field(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"EngineConfig\.{name}: expected .*number >= 0"):
        EngineConfig(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", INT_FIELDS)
@pytest.mark.parametrize("value", [0, -3, 1.5, None])
def test_bad_sizes_name_the_field(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"EngineConfig\.{name}: expected a positive integer"):
        EngineConfig(**{name: value})  # type: ignore[arg-type]


def test_shutdown_timeout_may_be_none_only_there() -> None:
    assert EngineConfig(shutdown_timeout=None).shutdown_timeout is None
    with pytest.raises(ValueError, match="rocm_process_grace_s"):
        EngineConfig(rocm_process_grace_s=None)  # type: ignore[arg-type]


def test_unknown_platform_lists_the_accepted_values() -> None:
    with pytest.raises(
        ValueError, match=r"platform: unknown value 'tpu'; accepted: auto, cuda, rocm, cpu"
    ):
        EngineConfig(platform="tpu")


def test_unknown_start_method_lists_the_accepted_values() -> None:
    with pytest.raises(ValueError, match=r"start_method: .*accepted: forkserver, spawn, fork"):
        EngineConfig(start_method="thread")


@pytest.mark.parametrize("platform", ["cuda", "rocm", "cpu"])
def test_a_forced_platform_decides_policy_but_tensors_stay_where_a_device_is(platform: str) -> None:
    config = EngineConfig(platform=platform)
    assert config.resolved_platform == platform
    assert config.device == "cpu"


def test_replace_validates_and_rederives() -> None:
    config = EngineConfig().replace(shutdown_timeout=7.0, platform="rocm")
    assert config.shutdown_timeout == 7.0 and config.resolved_platform == "rocm"
    with pytest.raises(ValueError, match="teardown_delay_s"):
        EngineConfig().replace(teardown_delay_s=-0.5)
    with pytest.raises(ValueError, match=r"unknown field\(s\) grace; accepted: platform"):
        EngineConfig().replace(grace=1.0)
