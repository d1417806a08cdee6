"""The helpers on coroutine shutdown methods: idempotence and finalization awaited (sync use on a
fresh loop, async use on the test's loop), ``loop-blocked`` for a close that blocks the event loop,
and the usage errors. Both sides for each finding."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import threading
import time
from typing import Any

import async_subjects as a
import pytest

from pytest_shutdown import (
    ShutdownContractError,
    assert_finalizes_on_gc,
    assert_idempotent_shutdown,
    assert_nonblocking_shutdown,
)
from pytest_shutdown.aio import (
    assert_finalizes_on_gc_async,
    assert_idempotent_shutdown_async,
    assert_nonblocking_shutdown_async,
)

SLEEP_LINE = inspect.getsourcelines(a.SleepsInAclose.aclose)[1] + 2  # the time.sleep line
JOIN_LINE = inspect.getsourcelines(a.JoinsInAclose.aclose)[1] + 2  # the join line
RECV_LINE = inspect.getsourcelines(a.RecvsInAclose.aclose)[1] + 2  # the recv line

#: The tests awaited on pytest-asyncio's loop (the dev extra installs it).
needs_pytest_asyncio = pytest.mark.skipif(
    importlib.util.find_spec("pytest_asyncio") is None, reason="needs pytest-asyncio"
)


def _started() -> a.AsyncEngine:
    """An engine whose output handler runs: started on a loop of its own (the sync use)."""
    engine = a.AsyncEngine()
    engine._handler = None  # started lazily by the async tests; the sync ones have no loop
    return engine


# ---- idempotence, sync use: no running loop, a fresh one runs every call -------------------


def test_idempotent_aclose_passes_and_every_call_is_awaited() -> None:
    engine = _started()
    report = assert_idempotent_shutdown(engine, "aclose", calls=3)
    assert engine.awaited == 3  # the second and third calls' coroutines were awaited too
    assert engine.cache.close_calls == 1
    assert report.cleanups["cache.close"]["call 1"] == 1


def test_second_aclose_that_re_frees_is_cleanup_repeated_naming_the_coroutine() -> None:
    engine = a.ReFreesAsyncEngine()
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(engine, "aclose", calls=2)
    (finding,) = exc.value.findings
    assert finding.code == "cleanup-repeated"
    assert finding.details["counts"] == {"call 1": 1, "call 2": 1}
    assert finding.details["shutdown"] == "ReFreesAsyncEngine.aclose"
    assert "await ReFreesAsyncEngine.aclose()" in finding.message
    assert engine.awaited == 2


def test_second_aclose_that_raises_is_shutdown_raised_naming_the_coroutine() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(a.RaisesAsyncEngine(), "aclose", calls=2)
    raised = [f for f in exc.value.findings if f.code == "shutdown-raised"]
    assert [f.details["call"] for f in raised] == [2]
    assert "aclose() call 2 raised RuntimeError" in raised[0].message
    assert raised[0].details["shutdown"] == "RaisesAsyncEngine.aclose"
    assert "cache already closed" in raised[0].details["traceback"]


def test_a_plain_method_returning_a_coroutine_is_awaited() -> None:
    obj = a.ReturnsAwaitable()
    assert_idempotent_shutdown(obj, "shutdown", calls=2)
    assert obj.awaited == 2 and obj.cache.close_calls == 1


def test_racing_first_round_runs_concurrent_calls_on_the_loop() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(a.ReFreesAsyncEngine(), "aclose", calls=2, threads=3)
    (finding,) = exc.value.findings
    assert finding.code == "cleanup-repeated"
    assert finding.details["counts"]["call 1"] == 3


# ---- idempotence, async use: awaited on the test's own loop ---------------------------------


@needs_pytest_asyncio
@pytest.mark.asyncio
async def test_async_idempotent_aclose_on_the_tests_loop_cancels_the_handler() -> None:
    engine = a.AsyncEngine()
    await engine.start()
    handler = engine._handler
    report = await assert_idempotent_shutdown_async(engine, calls=3)
    assert handler is not None and handler.cancelled()  # awaited on this loop, where it lived
    assert engine.awaited == 3 and engine.cache.close_calls == 1
    assert report.cleanups["cache.close"] == {"call 1": 1, "call 2": 0, "call 3": 0, "gc": 0}


@needs_pytest_asyncio
@pytest.mark.asyncio
async def test_async_second_aclose_raising_is_reported() -> None:
    engine = a.RaisesAsyncEngine()
    await engine.start()
    try:
        with pytest.raises(ShutdownContractError) as exc:
            await assert_idempotent_shutdown_async(engine, calls=2)
    finally:
        assert engine._handler is not None
        engine._handler.cancel()
    assert "shutdown-raised" in exc.value.codes
    assert "cleanup-repeated" in exc.value.codes


def test_async_use_without_pytest_asyncio_under_asyncio_run() -> None:
    async def body() -> int:
        engine = a.AsyncEngine()
        await engine.start()
        await assert_idempotent_shutdown_async(engine, calls=2)
        return engine.awaited

    assert asyncio.run(body()) == 2


@pytest.mark.parametrize(
    ("helper", "call"),
    [
        (
            "assert_idempotent_shutdown",
            lambda: assert_idempotent_shutdown(a.AsyncEngine(), "aclose"),
        ),
        (
            "assert_nonblocking_shutdown",
            lambda: assert_nonblocking_shutdown(a.AsyncEngine(), "aclose"),
        ),
        ("assert_finalizes_on_gc", lambda: assert_finalizes_on_gc(a.AsyncEngine, method="aclose")),
    ],
)
def test_sync_helper_inside_a_running_loop_is_a_usage_error_naming_the_async_variant(
    helper: str, call: Any
) -> None:
    async def body() -> None:
        call()

    with pytest.raises(RuntimeError, match=rf"await {helper}_async\(\.\.\.\)"):
        asyncio.run(body())


@pytest.mark.anyio
async def test_async_helpers_under_anyios_plugin_on_asyncio() -> None:
    engine = a.AsyncEngine()
    await engine.start()
    await assert_idempotent_shutdown_async(engine, calls=2)
    assert engine.awaited == 2
    with pytest.raises(ShutdownContractError) as exc:
        await assert_nonblocking_shutdown_async(a.SleepsInAclose(0.5), budget=0.1)
    assert exc.value.codes == ["loop-blocked"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the helpers await on an asyncio loop; trio has none


# ---- finalization ---------------------------------------------------------------------------


def test_finalizes_on_gc_awaits_the_twins_aclose() -> None:
    report = assert_finalizes_on_gc(a.AsyncEngine, method="aclose", timeout=2.0)
    assert report.details["explicit_cleanups"]  # aclose ran to its end: its cleanups were seen


def test_aclose_cleanup_missing_on_collection_is_caught() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_finalizes_on_gc(a.AsyncCloseNoFinalizer, method="aclose", timeout=2.0)
    (finding,) = exc.value.findings
    assert finding.code == "cleanup-missing"
    assert finding.details["cleanup"] == "cache.close"


@needs_pytest_asyncio
@pytest.mark.asyncio
async def test_async_finalizes_on_gc_both_sides() -> None:
    report = await assert_finalizes_on_gc_async(a.AsyncEngine, timeout=2.0)
    assert report.details["explicit_cleanups"]
    with pytest.raises(ShutdownContractError) as exc:
        await assert_finalizes_on_gc_async(a.AsyncCloseNoFinalizer, timeout=2.0)
    assert exc.value.codes == ["cleanup-missing"]


# ---- loop-blocked ---------------------------------------------------------------------------


def _blocked_at(exc: pytest.ExceptionInfo[ShutdownContractError], line: int) -> dict[str, Any]:
    (finding,) = exc.value.findings
    assert finding.code == "loop-blocked"
    assert finding.details["site"] == f"{a.__file__}:{line}"
    assert f"async_subjects.py:{line}" in finding.message
    assert finding.details["blocked_s"] >= 0.3
    assert f'File "{a.__file__}", line {line}' in finding.details["stack"]
    return dict(finding.details)


def test_time_sleep_in_aclose_is_loop_blocked_naming_the_sleeping_line() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_nonblocking_shutdown(a.SleepsInAclose(0.5), "aclose", budget=0.1)
    details = _blocked_at(exc, SLEEP_LINE)
    assert details["function"].endswith("SleepsInAclose.aclose") or details["function"] == "aclose"


def test_join_without_await_in_aclose_is_loop_blocked_naming_the_join() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_nonblocking_shutdown(a.JoinsInAclose(0.5), "aclose", budget=0.1)
    details = _blocked_at(exc, JOIN_LINE)
    assert "threading.py" in details["frame"]  # the innermost frame is join's own wait


def test_a_blocking_socket_call_in_aclose_is_loop_blocked_naming_the_recv() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_nonblocking_shutdown(a.RecvsInAclose(0.5), "aclose", budget=0.1)
    _blocked_at(exc, RECV_LINE)


def test_awaiting_in_aclose_is_not_loop_blocked() -> None:
    obj = a.AwaitsInAclose(0.5)
    report = assert_nonblocking_shutdown(obj, "aclose", budget=0.1)
    assert obj.awaited == 1
    assert report.timings["shutdown"] >= 0.5


@needs_pytest_asyncio
@pytest.mark.asyncio
async def test_async_loop_blocked_both_sides_on_the_tests_loop() -> None:
    await assert_nonblocking_shutdown_async(a.AwaitsInAclose(0.3), budget=0.1)
    with pytest.raises(ShutdownContractError) as exc:
        await assert_nonblocking_shutdown_async(a.SleepsInAclose(0.5), budget=0.1)
    _blocked_at(exc, SLEEP_LINE)


def test_async_loop_blocked_under_asyncio_run() -> None:
    async def body() -> list[str]:
        with pytest.raises(ShutdownContractError) as exc:
            await assert_nonblocking_shutdown_async(a.SleepsInAclose(0.5), budget=0.1)
        return exc.value.codes

    assert asyncio.run(body()) == ["loop-blocked"]


def test_an_aclose_that_never_completes_is_cancelled_after_grace() -> None:
    started = time.monotonic()
    with pytest.raises(ShutdownContractError) as exc:
        assert_nonblocking_shutdown(a.NeverCloses(), "aclose", budget=0.1, grace=0.3)
    assert time.monotonic() - started < 5
    assert exc.value.codes == ["blocking-close"]


def test_a_loop_blocked_for_good_is_reported_without_waiting_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("pytest_shutdown.helpers.async_shutdown.LOOP_EXIT_S", 0.2)
    obj = a.BlocksUntilReleased()
    started = time.monotonic()
    try:
        with pytest.raises(ShutdownContractError) as exc:
            assert_nonblocking_shutdown(obj, "aclose", budget=0.1, grace=0.3)
        assert time.monotonic() - started < 5
        stuck = [t for t in threading.enumerate() if t.name == "pytest-shutdown-fresh-loop"]
    finally:
        obj.release.set()
    assert exc.value.codes == ["loop-blocked", "blocking-close"]
    blocked = exc.value.findings[0].details
    assert blocked["still_blocked"] is True and blocked["blocked_s"] >= 0.4
    line = inspect.getsourcelines(a.BlocksUntilReleased.aclose)[1] + 1
    assert blocked["site"] == f"{a.__file__}:{line}"
    (loop_thread,) = stuck  # the helper left it blocked; released, it ends with its loop
    loop_thread.join(5)
    assert not loop_thread.is_alive()


# ---- usage errors, at once (the object's, the method's and the budget's: test_usage_errors.py) --


def test_executors_with_a_coroutine_method_is_a_usage_error() -> None:
    with pytest.raises(ValueError, match="executors: 'aclose' is a coroutine method"):
        assert_nonblocking_shutdown(a.SleepsInAclose(0.0), "aclose", executors=[])


# ---- a cleanup that is itself a coroutine: counted once per call, not once per resumption ---


def test_an_async_cleanup_that_suspends_is_counted_once() -> None:
    report = assert_idempotent_shutdown(a.ClosesAsyncSession(), "aclose", calls=2)
    assert report.cleanups["session.close"] == {"call 1": 1, "call 2": 0, "gc": 0}


def test_an_async_cleanup_awaited_again_is_cleanup_repeated() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(a.ReclosesAsyncSession(), "aclose", calls=2)
    (finding,) = exc.value.findings
    assert finding.details["cleanup"] == "session.close"
    assert finding.details["counts"] == {"call 1": 1, "call 2": 1}
