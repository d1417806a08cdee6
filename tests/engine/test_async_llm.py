"""AsyncLLM, the asyncio front end over ZMQ: real EngineCore processes, real sockets and signals.

The clean engine serves requests and ``aclose()`` (twice) leaves no task pending, no socket
open, no EngineCore running and its context terminated, within seconds, from a live loop, a
closing one and after the loop is closed. Each ``AsyncFaults`` toggle produces its bug with the
observable the real engines filed; every wait is bounded (``term()`` is probed in a daemon
thread, and a hung one is released before the test ends).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import psutil
import pytest
import zmq

from pytest_shutdown._os.killer import kill_trees
from pytest_shutdown.engine.async_llm import AsyncFaults, AsyncLLM, EngineDeadError
from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.zmq_client import wait_until_terminated

T = TypeVar("T")

#: The bound on every whole scenario.
SCENARIO_S = 60.0
#: What "within a few seconds" means for a clean close.
CLOSE_S = 5.0


def _config(**changes: Any) -> EngineConfig:
    base: dict[str, Any] = dict(
        platform="cpu", kv_cache_bytes=1 << 16, default_process_timeout_s=3.0
    )
    base.update(changes)
    return EngineConfig(**base)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, cancelled after ``SCENARIO_S`` (no extra task around it)."""

    async def bounded() -> T:
        task = asyncio.current_task()
        assert task is not None
        timer = asyncio.get_running_loop().call_later(SCENARIO_S, task.cancel)
        try:
            return await coro
        finally:
            timer.cancel()

    return asyncio.run(bounded())


def _other_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


#: The threads an AsyncLLM starts (its monitor, the bounded term() probe, the process stop).
ENGINE_THREADS = ("async-engine-monitor", "zmq-context-term", "async-llm-shutdown")


def _assert_all_released(engine: AsyncLLM) -> None:
    assert all(sock.closed for sock in engine.sockets)
    assert engine.context_terminated and engine.context.closed
    for proc in engine.processes:
        assert proc.exitcode is not None, proc.name
        assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == "zombie"
    deadline = time.monotonic() + CLOSE_S
    while _engine_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _engine_threads() == []


def _engine_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in ENGINE_THREADS]


@pytest.fixture
def engine_errors() -> Iterator[list[logging.LogRecord]]:
    """ERROR records of the engine's logger (its shutdown must log none)."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("pytest_shutdown.engine")
    handler = Collect(logging.ERROR)
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


async def _generate(engine: AsyncLLM, prompt: str, max_tokens: int) -> Any:
    last = None
    async for out in engine.generate(prompt, max_tokens):
        last = out
    return last


# -- the clean engine -------------------------------------------------------------------------
def test_the_clean_engine_serves_and_aclose_twice_releases_everything_within_seconds(
    engine_errors: list[logging.LogRecord],
) -> None:
    async def scenario() -> tuple[AsyncLLM, float, set[asyncio.Task[Any]]]:
        async with AsyncLLM.from_config(_config(data_parallel_size=2)) as engine:
            outs = await asyncio.gather(*(_generate(engine, f"p{i}", 4) for i in range(4)))
            assert [len(o.token_ids) for o in outs] == [4, 4, 4, 4]
            assert all(o.finish_reason == "length" for o in outs)
            assert len(engine.engine_pids) == 2
            started = time.monotonic()
        await engine.aclose()  # the second close
        return engine, time.monotonic() - started, _other_tasks()

    engine, took, pending = _run(scenario())
    assert took < CLOSE_S
    assert pending == set()
    assert engine.output_handler is not None and engine.output_handler.done()
    _assert_all_released(engine)
    assert engine_errors == []


def test_generate_streams_outputs_and_checks_its_arguments() -> None:
    async def scenario() -> list[Any]:
        async with AsyncLLM.from_config(_config()) as engine:
            with pytest.raises(ValueError, match="max_tokens"):
                await engine.generate("x", 0).__anext__()
            with pytest.raises(ValueError, match="empty prompt"):
                await engine.generate("", 2).__anext__()
            return [o async for o in engine.generate("hello", 3)]

    outs = _run(scenario())
    assert [len(o.token_ids) for o in outs] == [1, 2, 3]
    assert [o.finished for o in outs] == [False, False, True]


def test_aclose_ends_the_requests_in_flight_with_an_error() -> None:
    async def scenario() -> None:
        engine = AsyncLLM.from_config(_config(step_delay_s=0.01))
        await engine.start()
        request = asyncio.ensure_future(_generate(engine, "long", 1_000_000))
        await asyncio.sleep(0.2)
        await engine.aclose()
        with pytest.raises(RuntimeError, match="closed with the request in flight"):
            await asyncio.wait_for(request, CLOSE_S)

    _run(scenario())


def test_fork_is_refused_with_the_accepted_start_methods() -> None:
    with pytest.raises(ValueError, match="start_method='fork'.*accepted: forkserver, spawn"):
        AsyncLLM(_config(start_method="fork"))


def test_aclose_from_a_loop_that_is_closing_still_cleans_up() -> None:
    """A task left running when ``asyncio.run`` ends closes the engine in its ``finally``
    (during the runner's cancellation of the remaining tasks)."""
    box: list[AsyncLLM] = []

    async def owner(started: asyncio.Event) -> None:
        engine = AsyncLLM.from_config(_config())
        box.append(engine)
        try:
            await engine.start()
            started.set()
            await asyncio.sleep(3600)
        finally:
            await engine.aclose()

    async def main() -> None:
        started = asyncio.Event()
        asyncio.get_running_loop().create_task(owner(started))
        await asyncio.wait_for(started.wait(), SCENARIO_S)

    asyncio.run(main())
    _assert_all_released(box[0])


@pytest.mark.parametrize("close", ["shutdown", "aclose_on_a_new_loop"])
def test_a_close_after_the_loop_is_closed_still_cleans_up(close: str) -> None:
    engine = AsyncLLM.from_config(_config())

    async def serve() -> None:
        await engine.start()
        await _generate(engine, "hi", 2)

    _run(serve())
    started = time.monotonic()
    if close == "shutdown":
        engine.shutdown()
    else:
        _run(engine.aclose())
    assert time.monotonic() - started < CLOSE_S
    _assert_all_released(engine)
    engine.shutdown()  # and the other close afterwards does nothing
    _run(engine.aclose())


def test_an_engine_dropped_unclosed_is_reaped_by_its_gc_fallback() -> None:
    engine = AsyncLLM.from_config(_config())
    _run(engine.start())
    procs, res = engine.processes, engine._res
    del engine
    gc.collect()
    assert all(p.exitcode is not None for p in procs)
    assert all(sock.closed for sock in res.sockets) and res.context_terminated


def test_a_dead_engine_core_fails_the_requests_in_flight() -> None:
    async def scenario() -> None:
        async with AsyncLLM.from_config(_config(step_delay_s=0.01)) as engine:
            request = asyncio.ensure_future(_generate(engine, "long", 1_000_000))
            await asyncio.sleep(0.3)
            kill_trees([engine.processes[0].pid], why="the test kills an EngineCore", timeout=5)
            with pytest.raises(EngineDeadError, match="EngineCore_DP0"):
                await asyncio.wait_for(request, 10)
            assert engine.engine_dead

    _run(scenario())


# -- each toggle produces its bug -------------------------------------------------------------
def test_bug_output_handler_left_pending_logs_an_engine_dead_error_at_a_graceful_close(
    engine_errors: list[logging.LogRecord],
) -> None:
    """vLLM #48745: the handler outlives ``aclose`` and logs a traceback during a graceful
    shutdown."""

    async def scenario() -> bool:
        engine = AsyncLLM.from_config(_config(), faults=AsyncFaults(cancel_output_handler=False))
        await engine.start()
        await _generate(engine, "hi", 2)
        await engine.aclose()
        assert engine.output_handler is not None
        pending = not engine.output_handler.done()
        await asyncio.sleep(0.1)
        return pending

    assert _run(scenario()) is True
    assert [r.getMessage() for r in engine_errors] == ["AsyncLLM output_handler failed"]
    exc_info = engine_errors[0].exc_info
    assert exc_info is not None and exc_info[0] is EngineDeadError


#: What a connecting socket's monitor says once its peer went (libzmq says CLOSED and
#: CONNECT_RETRIED for an ipc peer, DISCONNECTED for others).
ZMQ_SAW_THE_PEER_GO = zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED | zmq.EVENT_CONNECT_RETRIED


def test_bug_sockets_without_linger_zero_make_term_hang_on_a_message_for_a_dead_engine() -> None:
    """vLLM PR #13298: with an EngineCore gone, the stop message queued for it keeps
    ``Context.term()`` from returning (probed in a daemon thread, released by the test)."""
    for bug in (False, True):
        engine = AsyncLLM.from_config(_config(), faults=AsyncFaults(socket_linger_zero=not bug))

        async def scenario(engine: AsyncLLM = engine) -> None:
            await engine.start()
            input_socket = engine._res.input_sockets[0]
            monitor = input_socket.get_monitor_socket(ZMQ_SAW_THE_PEER_GO)
            kill_trees([engine.processes[0].pid], why="the test kills an EngineCore", timeout=5)
            # Until ZMQ saw the peer go, the stop message may still be written to the dead
            # connection and dropped with it (term() then returns: a busy machine did so).
            await asyncio.wait_for(monitor.recv_multipart(), 5)
            input_socket.disable_monitor()
            monitor.close(linger=0)
            await engine.aclose()

        _run(scenario())
        assert all(sock.closed for sock in engine.sockets)
        assert engine.context_terminated is not bug
        if bug:
            _release_hung_term(engine)


def _release_hung_term(engine: AsyncLLM) -> None:
    """Bind the dead EngineCore's endpoint and take the message: the hung ``term()`` returns."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    try:
        sock.bind(engine.input_addrs[0])
        assert sock.poll(5000), "the queued message never arrived"
        sock.recv()
        assert wait_until_terminated(engine._res, 5.0)
    finally:
        sock.close(linger=0)
        ctx.term()


def test_bug_sockets_closed_from_another_thread_do_not_wake_the_task_awaiting_them() -> None:
    """vLLM PR #22877: ``shutdown()`` from another thread (a monitor) must close the async
    sockets on their loop. Closed from the thread, the output handler awaiting its socket is not
    woken: it ends only when something else wakes the loop (here the probe's timeout)."""

    def probe(bug: bool) -> float:
        engine = AsyncLLM.from_config(_config(), faults=AsyncFaults(close_on_own_loop=not bug))

        async def scenario() -> float:
            await engine.start()
            handler = engine.output_handler
            assert handler is not None
            closer = threading.Thread(target=engine.shutdown, name="monitor-shutdown")
            started = time.monotonic()
            closer.start()
            await asyncio.wait({handler}, timeout=2.0)
            took = time.monotonic() - started
            deadline = time.monotonic() + CLOSE_S
            while closer.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)  # the loop keeps running: the close runs on it
            return took

        took = _run(scenario())
        _assert_all_released(engine)
        return took

    assert probe(bug=False) < 1.0
    assert probe(bug=True) >= 1.9


def test_bug_cleanup_skipped_once_the_loop_is_closed_leaves_sockets_and_context() -> None:
    """vLLM PR #57757."""
    for bug in (False, True):
        engine = AsyncLLM.from_config(
            _config(), faults=AsyncFaults(cleanup_after_loop_closed=not bug)
        )
        _run(engine.start())
        engine.shutdown()
        assert [s.closed for s in engine.sockets] == [not bug] * 2
        assert engine.context_terminated is not bug
        if bug:  # the test releases what the bug left
            for sock in engine.sockets:
                zmq.Socket.close(sock, linger=0)
            engine.context.term()


def test_bug_aclose_not_idempotent_raises_on_the_second_call() -> None:
    async def scenario(bug: bool) -> None:
        engine = AsyncLLM.from_config(_config(), faults=AsyncFaults(idempotent_aclose=not bug))
        await engine.start()
        await engine.aclose()
        await engine.aclose()

    _run(scenario(bug=False))
    with pytest.raises(zmq.ZMQError):
        _run(scenario(bug=True))
