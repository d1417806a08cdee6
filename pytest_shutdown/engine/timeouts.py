"""How long the parent waits for EngineCore processes to exit.

A request-drain budget of 0 says nothing about how long the *process* needs to release its
device: a ROCm teardown takes seconds, and a parent that SIGKILLs it leaves VRAM held. A zero
*remaining* budget handed down from a positive drain timeout is spent time, and gets no grace.
"""

from __future__ import annotations

ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S = 15.0


def get_engine_process_shutdown_timeout(
    request_timeout: float | None,
    process_timeout: float | None,
    platform: str | None = None,
    *,
    rocm_grace_s: float = ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S,
) -> float | None:
    """The process-cleanup timeout for an EngineCore shutdown.

    Returns ``rocm_grace_s`` only when ``request_timeout == 0``, ``process_timeout == 0`` and the
    platform (detected when None) is ROCm; otherwise ``process_timeout`` unchanged, None included.
    """
    if request_timeout == 0 and process_timeout == 0:
        if platform is None:
            from pytest_shutdown.gpu.detect import detect_platform  # noqa: PLC0415

            platform = detect_platform()
        if platform == "rocm":
            return rocm_grace_s
    return process_timeout
