"""``aclose()`` twice: the second call sends on the sockets the first one closed, and raises.

An async engine is closed from more than one place: ``async with`` and an explicit ``aclose()``,
a server's lifespan and its signal handler, a fixture's teardown after the test's own close. A
close that is not idempotent runs its shutdown again: here it tells the EngineCores to stop on
input sockets the first close already closed, and raises ``ZMQError: Socket operation on
non-socket`` (vLLM PR #16807 filed the same error: an abort sent on the closed socket of an
engine shutting down). The reference engine puts the bug back with
``AsyncFaults(idempotent_aclose=False)``; ``assert_idempotent_shutdown_async`` awaits
``aclose()`` again on the engine's own loop and reports ``shutdown-raised`` with the traceback.
Fixed (the engine's default): a closed engine's ``aclose()`` returns at once.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch", reason="the reference engine needs torch (extra 'engine')")
zmq = pytest.importorskip("zmq", reason="the async front end needs pyzmq")

from pytest_shutdown import ShutdownContractError  # noqa: E402
from pytest_shutdown.aio import assert_idempotent_shutdown_async  # noqa: E402
from pytest_shutdown.engine import AsyncFaults, AsyncLLM, EngineConfig  # noqa: E402

CONFIG = EngineConfig(platform="cpu", kv_cache_bytes=1 << 16, default_process_timeout_s=3.0)


async def serve_then_close_repeatedly(engine: AsyncLLM, calls: int) -> None:
    await engine.start()
    async for _ in engine.generate("hello", max_tokens=2):
        pass
    await assert_idempotent_shutdown_async(engine, "aclose", calls=calls)


def expect(code: str, error: ShutdownContractError, engine: AsyncLLM) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert set(error.codes) == {code}, error.codes
    (raised,) = error.findings
    assert "zmq.error.ZMQError: Socket operation on non-socket" in raised.details["traceback"]
    assert "_tell_engines_to_stop" in raised.details["traceback"]
    assert all(sock.closed for sock in engine.sockets)  # the first close did its work
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="second aclose raises")
def test_buggy_engine_raises_on_the_second_aclose() -> None:
    engine = AsyncLLM.from_config(CONFIG, faults=AsyncFaults(idempotent_aclose=False))
    try:
        asyncio.run(serve_then_close_repeatedly(engine, calls=2))
    except ShutdownContractError as error:
        expect("shutdown-raised", error, engine)


def test_fixed_engine_can_be_closed_any_number_of_times() -> None:
    asyncio.run(serve_then_close_repeatedly(AsyncLLM.from_config(CONFIG), calls=3))
