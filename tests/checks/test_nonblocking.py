"""assert_nonblocking_shutdown: blocking-close, thread-leak, process-leak; correct code passes."""

from __future__ import annotations

import inspect
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
import shutdown_subjects as s

from pytest_shutdown import ShutdownContractError, assert_nonblocking_shutdown


def test_correct_renderer_returns_while_its_pools_are_busy() -> None:
    renderer = s.GoodRenderer()
    report = assert_nonblocking_shutdown(renderer, budget=2.0)
    assert sorted(report.details["executors"]) == ["_executor", "_mm_executor"]
    assert report.timings["shutdown"] < 2.0


def test_enter_context_executor_is_a_blocking_close_naming_the_executor() -> None:
    started = time.monotonic()
    with pytest.raises(ShutdownContractError) as exc:
        assert_nonblocking_shutdown(s.EnterContextExecutor(), budget=0.2)
    assert time.monotonic() - started < 20  # reported after the budget, never hangs
    (finding,) = exc.value.findings
    assert finding.code == "blocking-close"
    assert finding.details["executors"] == ["_executor"]
    assert "shutdown" in finding.details["stack"]


class _JoinsItsWorker:
    """Its pool is shut down without waiting; its worker process is joined (still running)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.worker = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(1.0,))
        self.worker.start()

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False)
        self.worker.join(30)


def test_a_wait_that_is_not_an_executor_is_named_with_its_caller() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_nonblocking_shutdown(_JoinsItsWorker(), budget=0.2, grace=30)
    (finding,) = exc.value.findings
    assert finding.code == "blocking-close"
    join_line = _line_of(_JoinsItsWorker.shutdown, "self.worker.join")
    where = f"SpawnProcess.join called from _JoinsItsWorker.shutdown at {__file__}:{join_line}"
    assert finding.details["blocked_in"] == where.replace(__file__, _relative(__file__))
    assert f"in {finding.details['blocked_in']}: not an executor" in finding.message
    assert "budget counts every wait of shutdown()" in finding.message
    assert "executors" not in finding.details and finding.details["occupied"] == ["pool"]


def test_an_executor_wait_is_named_as_the_executor_and_the_call() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_nonblocking_shutdown(s.EnterContextExecutor(), budget=0.2)
    (finding,) = exc.value.findings
    assert "blocked on _executor after 0.2s" in finding.message
    assert "(in ExitStack.close called from EnterContextExecutor.shutdown at " in finding.message
    assert "not an executor" not in finding.message


def _line_of(function: object, needle: str) -> int:
    lines, first = inspect.getsourcelines(function)  # type: ignore[arg-type]
    return first + next(i for i, line in enumerate(lines) if needle in line)


def _relative(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


def test_a_forgotten_executor_is_a_thread_leak() -> None:
    obj = s.ForgetsExecutor()
    try:
        with pytest.raises(ShutdownContractError) as exc:
            assert_nonblocking_shutdown(obj, budget=1.0, grace=0.3)
    finally:
        obj._executor.shutdown(wait=True)
    (finding,) = exc.value.findings
    assert finding.code == "thread-leak"
    assert finding.details["executor"] == "_executor"
    assert finding.details["threads"] and finding.details["threads"][0].startswith("forgotten")


def test_a_thread_pool_shut_down_without_wait_passes() -> None:
    class Holder:
        def __init__(self) -> None:
            self.pool = ThreadPoolExecutor(max_workers=3)

        def shutdown(self) -> None:
            self.pool.shutdown(wait=False)

    assert_nonblocking_shutdown(Holder(), budget=2.0)


def test_a_bare_thread_pool_shutdown_waits_by_default() -> None:
    pool = ThreadPoolExecutor(max_workers=1)
    with pytest.raises(ShutdownContractError) as exc:
        assert_nonblocking_shutdown(pool, budget=0.2)
    assert exc.value.codes == ["blocking-close"]
    assert exc.value.findings[0].details["executors"] == ["ThreadPoolExecutor"]


class _ProcessHolder:
    def __init__(self, forget: bool) -> None:
        self.pool = ProcessPoolExecutor(max_workers=1)
        self.forget = forget

    def shutdown(self) -> None:
        if not self.forget:
            self.pool.shutdown(wait=False, cancel_futures=True)


def test_process_pool_non_blocking_shutdown_passes_and_workers_end() -> None:
    holder = _ProcessHolder(forget=False)
    assert_nonblocking_shutdown(holder, budget=2.0, grace=20.0)


def test_a_forgotten_process_pool_leaks_its_worker_and_manager_thread() -> None:
    holder = _ProcessHolder(forget=True)
    try:
        with pytest.raises(ShutdownContractError) as exc:
            assert_nonblocking_shutdown(holder, budget=1.0, grace=0.3)
    finally:
        holder.pool.shutdown(wait=True)
    assert set(exc.value.codes) == {"thread-leak", "process-leak"}
    leak = next(f for f in exc.value.findings if f.code == "process-leak")
    assert len(leak.details["pids"]) == 1


def test_no_executor_found_or_given_is_an_error_not_a_pass() -> None:
    with pytest.raises(ValueError, match="executors"):
        assert_nonblocking_shutdown(s.RacyShutdown())


@pytest.mark.parametrize(("name", "value"), [("budget", 0), ("grace", float("inf"))])
def test_bad_durations_name_the_option(name: str, value: float) -> None:
    renderer = s.GoodRenderer()
    try:
        with pytest.raises(ValueError, match=name):
            assert_nonblocking_shutdown(renderer, **{name: value})  # type: ignore[arg-type]
    finally:
        renderer.shutdown()


def test_executors_given_explicitly_are_the_ones_occupied() -> None:
    hidden = ThreadPoolExecutor(max_workers=2)

    class Hides:
        """Keeps its pool only in a closure: discovery cannot see it, ``executors=`` can."""

        def __init__(self) -> None:
            self.shutdown = lambda: hidden.shutdown(wait=True)

    with pytest.raises(ShutdownContractError) as exc:
        assert_nonblocking_shutdown(Hides(), budget=0.2, executors=[hidden])
    assert exc.value.findings[0].details["executors"] == ["executors[0]"]
