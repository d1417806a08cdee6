"""The helpers on an asyncio front end: ``async def aclose`` is awaited and must not block its loop.

``FrontEnd`` is the shape of vLLM's ``AsyncLLM`` without the model: an output-handler task started
on first use and an ``aclose`` that cancels and awaits it, once. Called from a sync test, the
helpers await ``aclose`` on a fresh event loop; from an ``async def`` test (pytest-asyncio), their
``*_async`` forms await it on the test's own loop, where the task lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import time

import pytest

from pytest_shutdown import (
    ShutdownContractError,
    assert_idempotent_shutdown,
    assert_nonblocking_shutdown,
)
from pytest_shutdown.aio import assert_idempotent_shutdown_async, assert_nonblocking_shutdown_async

needs_pytest_asyncio = pytest.mark.skipif(
    importlib.util.find_spec("pytest_asyncio") is None, reason="needs pytest-asyncio"
)


class Socket:
    """Stands for the front end's ZMQ socket: closing it twice is a bug."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        if self.closed:
            raise RuntimeError("socket already closed")
        self.closed = True


class FrontEnd:
    """An asyncio client with an output-handler task; ``aclose`` is idempotent."""

    def __init__(self) -> None:
        self.socket = Socket()
        self._handler: asyncio.Task[None] | None = None
        self._closed = False

    async def generate(self) -> None:
        if self._handler is None:  # started lazily, on the caller's loop (as AsyncLLM does)
            self._handler = asyncio.get_running_loop().create_task(self._output_handler())

    async def _output_handler(self) -> None:
        while True:
            await asyncio.sleep(0.01)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._handler is not None:
            self._handler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._handler
        self.socket.close()


def test_aclose_twice_is_harmless() -> None:
    # no loop runs here: every aclose() is awaited on one fresh loop, the second one too
    front_end = FrontEnd()
    assert_idempotent_shutdown(front_end, "aclose")
    assert front_end.socket.closed


@needs_pytest_asyncio
@pytest.mark.asyncio
async def test_aclose_twice_is_harmless_on_the_tests_loop() -> None:
    front_end = FrontEnd()
    await front_end.generate()  # the output handler now runs on this test's loop
    await assert_idempotent_shutdown_async(front_end)
    await assert_nonblocking_shutdown_async(FrontEnd(), budget=0.1)


class DrainsBySleeping(FrontEnd):
    """A bug: aclose drains with time.sleep, freezing every other task of the loop meanwhile."""

    async def aclose(self) -> None:
        time.sleep(0.3)  # should be: await asyncio.sleep(0.3)
        await super().aclose()


def test_a_sleep_inside_aclose_blocks_the_loop() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_nonblocking_shutdown(DrainsBySleeping(), "aclose", budget=0.1)
    (finding,) = exc.value.findings
    assert finding.code == "loop-blocked"
    assert finding.details["site"].startswith(f"{__file__}:")  # file:line of the sleep
    assert "time.sleep(0.3)" in finding.details["stack"]
