"""vLLM #48745: ``aclose()`` returns with the output handler still pending.

vLLM's ``AsyncLLM.shutdown()`` tore the engine down first and cancelled its ``output_handler``
task last, and never awaited it: when shutdown returned, the task was still pending, and it died
later by a ``CancelledError`` it did not choose (here: the closing of the socket it awaits; in a
test, ``asyncio.run`` or the loop fixture cancels it). The reference engine puts the bug back with
``AsyncFaults(cancel_output_handler=False)``. ``no_task_leaks(grace=0)`` states the contract: when
``await engine.aclose()`` returns, no task the engine started is pending (the default grace would
let the socket's close end the handler a moment later). Fixed (the engine's default; vLLM PR
#49000 marks the shutdown first too): mark the engine closing, cancel the handler and await it,
then stop the EngineCores.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch", reason="the reference engine needs torch (extra 'engine')")
pytest.importorskip("zmq", reason="the async front end needs pyzmq")

from pytest_shutdown import ShutdownContractError, no_task_leaks  # noqa: E402
from pytest_shutdown.engine import AsyncFaults, AsyncLLM, EngineConfig  # noqa: E402

CONFIG = EngineConfig(platform="cpu", kv_cache_bytes=1 << 16, default_process_timeout_s=3.0)


async def serve_and_close(engine: AsyncLLM) -> None:
    """Serve one request, then close; the block checks the moment ``aclose()`` returns."""
    async with no_task_leaks(grace=0):
        await engine.start()
        async for _ in engine.generate("hello", max_tokens=2):
            pass
        await engine.aclose()


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert set(error.codes) == {code}, error.codes
    (leak,) = error.findings
    assert leak.details["name"].endswith("AsyncLLM._handle_outputs"), leak.details["name"]
    assert leak.details["created_at"].endswith("in AsyncLLM.start"), leak.details["created_at"]
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="the handler is pending")
def test_buggy_aclose_returns_with_the_output_handler_pending() -> None:
    async def scenario() -> None:
        engine = AsyncLLM.from_config(CONFIG, faults=AsyncFaults(cancel_output_handler=False))
        try:
            await serve_and_close(engine)
        except ShutdownContractError as error:
            expect("task-leak", error)
        finally:
            await engine.aclose()

    asyncio.run(scenario())


def test_fixed_aclose_cancels_and_awaits_the_output_handler() -> None:
    asyncio.run(serve_and_close(AsyncLLM.from_config(CONFIG)))
