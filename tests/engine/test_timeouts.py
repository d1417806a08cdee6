"""get_engine_process_shutdown_timeout: the ROCm cleanup grace only for an immediate abort on
ROCm, never for a spent budget."""

from __future__ import annotations

import pytest

from pytest_shutdown.engine.timeouts import (
    ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S,
    get_engine_process_shutdown_timeout,
)


def test_the_grace_is_fifteen_seconds() -> None:
    assert ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S == 15.0


# The table of the upstream test (vllm tests/v1/engine/test_startup_watch_processes.py).
@pytest.mark.parametrize(
    ("platform", "request_timeout", "process_timeout", "expected"),
    [
        ("rocm", 0, 0, 15.0),
        ("rocm", 0, 7, 7),
        ("rocm", 0, None, None),
        ("cuda", 0, 0, 0),
        ("rocm", 7, 0, 0),
    ],
    ids=["rocm-0-0", "rocm-0-7", "rocm-0-None", "cuda-0-0", "rocm-7-0-spent-budget"],
)
def test_upstream_table(platform, request_timeout, process_timeout, expected) -> None:
    got = get_engine_process_shutdown_timeout(request_timeout, process_timeout, platform)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("platform", ["cuda", "rocm", "cpu"])
@pytest.mark.parametrize("request_timeout", [None, 0, 0.0, 7.0])
@pytest.mark.parametrize("process_timeout", [None, 0, 0.0, 2.5])
def test_the_whole_matrix(platform, request_timeout, process_timeout) -> None:
    got = get_engine_process_shutdown_timeout(
        request_timeout, process_timeout, platform, rocm_grace_s=1.5
    )
    grace = platform == "rocm" and request_timeout == 0 and process_timeout == 0
    assert got == (1.5 if grace else process_timeout)


def test_platform_none_uses_the_detected_platform() -> None:
    # This machine has no GPU: detection says cpu, so no grace.
    assert get_engine_process_shutdown_timeout(0, 0) == 0
