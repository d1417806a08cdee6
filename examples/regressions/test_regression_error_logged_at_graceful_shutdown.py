"""vLLM #48745: a graceful shutdown logs an ``EngineDeadError`` traceback.

``AsyncLLM.shutdown()`` stopped the EngineCores while the output handler still ran; the handler
saw them leave, took the engine for dead and logged ``"AsyncLLM output_handler failed."`` with an
``EngineDeadError`` traceback. The shutdown succeeded and no test failed: only users reading the
log thought the server had crashed. The reference engine puts the bug back with
``AsyncFaults(cancel_output_handler=False)``; ``no_logged_errors()`` around the close reports it
as ``shutdown-logged-error`` naming the logger, the exception and the line that logged it (the
guard does the same under ``--shutdown-quiet`` when a fixture's teardown closes the engine).
Fixed (the engine's default, and vLLM PR #49000's idea): the engine is marked closing before
anything is torn down, so the handler tells a requested stop from a death, and it is cancelled
before the EngineCores stop.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch", reason="the reference engine needs torch (extra 'engine')")
pytest.importorskip("zmq", reason="the async front end needs pyzmq")

from pytest_shutdown import ShutdownContractError, no_logged_errors  # noqa: E402
from pytest_shutdown.engine import AsyncFaults, AsyncLLM, EngineConfig  # noqa: E402

CONFIG = EngineConfig(platform="cpu", kv_cache_bytes=1 << 16, default_process_timeout_s=3.0)


async def serve_then_close_quietly(engine: AsyncLLM) -> None:
    async with engine:
        async for _ in engine.generate("hello", max_tokens=2):
            pass
        with no_logged_errors():
            await engine.aclose()


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert set(error.codes) == {code}, error.codes
    (logged,) = error.findings
    assert logged.details["logger"] == "pytest_shutdown.engine"
    assert logged.details["message"] == "AsyncLLM output_handler failed"
    assert logged.details["exception"] == "EngineDeadError"
    assert logged.details["function"] == "_handle_outputs", logged.details["where"]
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="shutdown logs an error")
def test_buggy_graceful_shutdown_logs_an_engine_dead_error() -> None:
    engine = AsyncLLM.from_config(CONFIG, faults=AsyncFaults(cancel_output_handler=False))
    try:
        asyncio.run(serve_then_close_quietly(engine))
    except ShutdownContractError as error:
        expect("shutdown-logged-error", error)


def test_fixed_graceful_shutdown_logs_nothing() -> None:
    asyncio.run(serve_then_close_quietly(AsyncLLM.from_config(CONFIG)))
