"""vLLM PR #22877: async ZMQ sockets closed from another thread, not on their event loop.

vLLM's client cleanup (``BackgroundResources``) runs in whatever thread shuts the engine down:
the engine monitor's thread when an EngineCore dies, a finalizer, a signal handler. It closed the
``zmq.asyncio`` sockets right there. Closing an async socket cancels the futures of the tasks
awaiting it, but from a foreign thread that cancellation is not thread-safe and does not wake the
loop: the output task awaiting its socket stays pending until something else happens to wake the
loop, and a server whose loop is idle never ends it. The reference engine puts the bug back with
``AsyncFaults(close_on_own_loop=False)``: its loop serves in a thread, and ``shutdown()`` is
called from this one, as vLLM's monitor does. ``no_task_leaks()`` (its ``with`` form waits out
the grace without waking that loop) reports the output handler still pending, still awaiting the
socket closed under it. Fixed (PR #22877, the engine's default): the close is handed to the
sockets' loop with ``call_soon_threadsafe``, which wakes it.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

pytest.importorskip("torch", reason="the reference engine needs torch (extra 'engine')")
pytest.importorskip("zmq", reason="the async front end needs pyzmq")

from pytest_shutdown import ShutdownContractError, no_task_leaks  # noqa: E402
from pytest_shutdown.engine import AsyncFaults, AsyncLLM, EngineConfig  # noqa: E402

CONFIG = EngineConfig(platform="cpu", kv_cache_bytes=1 << 16, default_process_timeout_s=3.0)
#: The bound on each step run on the serving loop.
STEP_S = 60.0


@contextmanager
def serving_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own (a server's), stopped and closed at the end."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="serving-loop", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)  # wakes the loop: what the bug left pending ends
        thread.join(STEP_S)
        loop.close()


async def serve_one(engine: AsyncLLM) -> None:
    await engine.start()
    async for _ in engine.generate("hello", max_tokens=2):
        pass


def serve_then_shut_down_from_this_thread(faults: AsyncFaults) -> None:
    with serving_loop() as loop, no_task_leaks():
        engine = AsyncLLM.from_config(CONFIG, faults=faults)
        asyncio.run_coroutine_threadsafe(serve_one(engine), loop).result(STEP_S)
        engine.shutdown()  # from this thread, as vLLM's engine monitor does


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert set(error.codes) == {code}, error.codes
    (leak,) = error.findings
    assert leak.details["name"].endswith("AsyncLLM._handle_outputs"), leak.details["name"]
    assert leak.details["waiting_at"].startswith(str(inspect.getsourcefile(AsyncLLM)))
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="the handler is not woken")
def test_buggy_close_from_another_thread_leaves_the_output_handler_waiting() -> None:
    try:
        serve_then_shut_down_from_this_thread(AsyncFaults(close_on_own_loop=False))
    except ShutdownContractError as error:
        expect("task-leak", error)


def test_fixed_close_runs_on_the_sockets_loop_and_ends_the_output_handler() -> None:
    serve_then_shut_down_from_this_thread(AsyncFaults())
