"""The teardown budget: hung teardowns end, the session goes on; beside pytest-timeout."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from inner_runs import A_LEAKS_A_THREAD

from pytest_shutdown.plugin.budget import ShutdownBudgetExceeded, TeardownBudget

HUNG = textwrap.dedent(
    """
    import subprocess, sys, time
    import pytest

    @pytest.fixture
    def waits_for_child():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        yield proc
        proc.wait()  # hangs: nobody told the child to stop

    @pytest.fixture
    def sleeps():
        yield
        time.sleep(120)

    def test_hung_on_child(waits_for_child):
        pass

    @pytest.mark.shutdown_budget(0.5)
    def test_hung_sleeping(sleeps):
        pass

    def test_next_one_runs():
        pass
    """
)


def run_within(
    seconds: float, pytester: pytest.Pytester, *args: str, timeout: float | None = None
) -> pytest.RunResult:
    """A run with the plugin and ``args`` that must end in under ``seconds`` (pytester kills
    it after ``timeout``)."""
    start = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "shutdown", *args, timeout=timeout)
    assert time.monotonic() - start < seconds
    return result


def test_hung_teardown_ends_at_the_budget_and_the_session_goes_on(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_hung=HUNG)
    result = run_within(60, pytester, "--shutdown-budget=1", "--shutdown-report=r.json")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ShutdownBudgetExceeded: shutdown budget of 1 s exceeded in the teardown of "
            "test_hung.py::test_hung_on_child*",
            "*Captured shutdown budget teardown*",
            "shutdown budget of 1 s exceeded after * s (signal method)",
            "  killed process * (python): *time.sleep(120)",
            "  stack of thread 'MainThread'*",
            "*ShutdownBudgetExceeded: shutdown budget of 0.5 s exceeded*test_hung_sleeping*",
        ]
    )
    report = json.loads((pytester.path / "r.json").read_text())
    by_id = {t["nodeid"]: t for t in report["tests"]}
    hung = by_id["test_hung.py::test_hung_on_child"]
    assert hung["budget"]["fired"] and hung["budget"]["budget_s"] == 1.0
    assert [f["code"] for f in hung["findings"]] == ["shutdown-budget", "force-killed"]
    assert any("proc.wait()" in t["stack"] for t in hung["budget"]["threads"])
    assert by_id["test_hung.py::test_hung_sleeping"]["budget"]["budget_s"] == 0.5
    assert report["summary"]["budgets_exceeded"] == 2


def slow_teardown(seconds: float, test: str) -> str:
    """An inner test file: ``test`` passes, its fixture ``sleeps`` sleeps ``seconds`` in its
    teardown (``time`` and ``pytest`` imported)."""
    return textwrap.dedent(
        f"""
        import time
        import pytest

        @pytest.fixture
        def sleeps():
            yield
            time.sleep({seconds})

        def {test}(sleeps):
            pass
        """
    )


def test_without_a_budget_a_slow_teardown_is_left_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(slow_teardown(0.5, "test_slow"))
    result = pytester.runpytest_subprocess("-p", "shutdown")
    result.assert_outcomes(passed=1)


def test_pytest_timeout_governs_the_body_and_a_hang_is_reported_once(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_timeout=textwrap.dedent(
            """
            import threading, time

            def test_body_hangs():
                threading.Thread(target=threading.Event().wait, daemon=True).start()
                time.sleep(30)
            """
        )
    )
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--timeout=1", "--shutdown-budget=5", "--shutdown-report=r.json"
    )
    # pytest-timeout's failure only: the thread left by the hung body is not a second error.
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Timeout (>1.0s) from pytest-timeout*"])
    (record,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    assert record["reported"] is False
    assert [f["code"] for f in record["findings"]] == ["thread-leak"]


def test_pytest_timeout_due_first_wins_in_teardown_too(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(slow_teardown(30, "test_hung"))
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--timeout=1", "--shutdown-budget=20", "--shutdown-report=r.json"
    )
    result.assert_outcomes(passed=1, errors=1)
    out = result.stdout.str()
    assert "from pytest-timeout" in out
    assert "ShutdownBudgetExceeded" not in out
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["summary"]["budgets_exceeded"] == 0


def test_budget_first_then_pytest_timeout_still_works(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        slow_teardown(30, "test_hung_teardown") + "\ndef test_hung_body():\n    time.sleep(30)\n"
    )
    result = run_within(30, pytester, "--timeout=3", "--shutdown-budget=0.5")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ShutdownBudgetExceeded: shutdown budget of 0.5 s*",
            "*Timeout (>3.0s) from pytest-timeout*",
        ]
    )


# --- TeardownBudget directly ---------------------------------------------------------------


def test_thread_method_interrupts_python_code() -> None:
    killed: list[str] = []

    def on_expire() -> list[dict[str, object]]:
        killed.append("called")
        return [{"pid": 0}]

    start = time.monotonic()
    with pytest.raises(ShutdownBudgetExceeded):
        with TeardownBudget(0.3, "loop", on_expire, method="thread") as budget:
            while time.monotonic() - start < 20:
                time.sleep(0.01)
    assert time.monotonic() - start < 10
    assert budget.outcome.fired and budget.outcome.method == "thread"
    assert killed == ["called"] and budget.outcome.killed == [{"pid": 0}]
    assert any(t["name"] == threading.current_thread().name for t in budget.outcome.threads)
    assert not any(t.name.startswith("pytest-shutdown budget") for t in threading.enumerate())


AFTER_A_THREAD_BUDGET = textwrap.dedent(
    """
    import sys, time
    from pytest_shutdown.plugin.budget import ShutdownBudgetExceeded, TeardownBudget

    try:
        with TeardownBudget(0.2, "loop", method="thread"):
            while True:
                time.sleep(0.01)
    except ShutdownBudgetExceeded:
        print("fired")

    def later_test():
        pass

    sys.setprofile(lambda frame, event, arg: None)  # a profiler, coverage, a cleanup counter
    later_test()
    sys.setprofile(None)
    print("no spin")
    """
)


def test_a_fired_thread_budget_leaves_no_stuck_async_exception_flag() -> None:
    # On CPython 3.11, clearing the undelivered exception with PyThreadState_SetAsyncExc(id,
    # NULL) left the interpreter's async-exception flag set for good: the next profiled Python
    # call spun forever, out of reach of pytest-timeout's SIGALRM handler (it spun too).
    try:
        done = subprocess.run(
            [sys.executable, "-c", AFTER_A_THREAD_BUDGET],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a profiled call after a fired thread-method budget spun forever")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fired", "no", "spin"]


def test_budget_not_reached_does_nothing() -> None:
    for method in ("signal", "thread"):
        with TeardownBudget(5.0, "quick", method=method) as budget:
            time.sleep(0.01)
        assert not budget.outcome.fired
        assert 0 < budget.outcome.elapsed_s < 5


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs SIGALRM")
def test_signal_method_restores_the_previous_handler_and_timer() -> None:
    fired: list[int] = []

    def previous(signum: int, frame: object) -> None:
        fired.append(signum)

    old = signal.signal(signal.SIGALRM, previous)
    old_timer = signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        with pytest.raises(ShutdownBudgetExceeded):
            with TeardownBudget(0.2, "sleep", method="signal"):
                time.sleep(10)
        assert signal.getsignal(signal.SIGALRM) is previous
        remaining = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 20 < remaining < 30  # re-armed with what was left, not reset
        # A timer due before the budget governs: the budget does not arm.
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with TeardownBudget(5.0, "deferred", method="signal") as budget:
            deadline = time.monotonic() + 10
            while not fired and time.monotonic() < deadline:
                time.sleep(0.01)
        assert budget.outcome.deferred_to_timeout and fired == [signal.SIGALRM]
    finally:
        signal.signal(signal.SIGALRM, old)
        signal.setitimer(signal.ITIMER_REAL, *old_timer)


def test_tool_threads_are_recognised_and_user_threads_are_not() -> None:
    from pytest_shutdown.plugin.guard import is_tool_thread

    timer = threading.Timer(30, lambda: None)
    timer.name = "pytest_timeout test_x.py::test_y"  # how pytest-timeout names its timer
    user = threading.Thread(target=time.sleep, args=(0,), name="pytest_timeout_lookalike")
    assert is_tool_thread(timer)
    assert not is_tool_thread(user)
    assert not is_tool_thread(threading.Thread(target=print))


# --- hangs in C, teardowns that ignore the budget, engines cut short ------------------------

C_WAIT = textwrap.dedent(
    """
    import ctypes, signal, subprocess, sys
    import pytest

    @pytest.fixture
    def waits_in_c_for_its_child():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        yield
        # One C call that no signal interrupts: the main thread is not back in Python until
        # the child is gone, so no Python signal handler can run meanwhile.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            ctypes.CDLL(None).waitpid(proc.pid, ctypes.byref(ctypes.c_int()), 0)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})

    def test_hung_in_c(waits_in_c_for_its_child):
        pass

    def test_next_one_runs():
        pass
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libc through ctypes")
def test_a_teardown_stuck_in_c_is_ended_at_the_budget_with_its_children_killed(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_c=C_WAIT)
    result = run_within(
        60, pytester, "-p", "no:randomly", "--shutdown-budget=1", "--shutdown-report=r.json",
        timeout=90,
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["*ShutdownBudgetExceeded: shutdown budget of 1 s exceeded*test_c.py::test_hung_in_c*"]
    )
    (record,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    assert [f["code"] for f in record["findings"]] == ["shutdown-budget", "force-killed"]
    (killed,) = record["budget"]["killed"]
    assert "time.sleep(120)" in " ".join(killed["cmdline"])


HUNG_FOR_GOOD = A_LEAKS_A_THREAD + textwrap.dedent(
    """
    import ctypes, signal, time

    @pytest.fixture
    def in_c():
        yield
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        ctypes.CDLL(None).pause()  # no handler ever runs in this thread again: never returns

    @pytest.fixture
    def in_python():
        yield
        while True:  # swallows every interrupt
            try:
                time.sleep(100)
            except BaseException:
                pass

    def test_b_hangs(FIXTURE):
        pass

    def test_c_never_runs():
        pass
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libc through ctypes")
@pytest.mark.parametrize("fixture", ["in_c", "in_python"])
def test_a_teardown_that_never_returns_ends_the_process_after_a_second_budget(
    pytester: pytest.Pytester, fixture: str
) -> None:
    from pytest_shutdown.plugin.budget import HUNG_TEARDOWN_EXIT_CODE

    pytester.makepyfile(test_hang=HUNG_FOR_GOOD.replace("FIXTURE", fixture))
    result = run_within(
        60, pytester, "-p", "no:randomly", "--shutdown-budget=1", "--shutdown-grace=0.2",
        "--shutdown-report=r.json", timeout=90,
    )
    assert result.ret == HUNG_TEARDOWN_EXIT_CODE == 70
    err = result.stderr.str()
    assert "+++ pytest-shutdown: the teardown of test_hang.py::test_b_hangs did not return" in err
    assert f"in {fixture}" in err  # faulthandler's dump of the stuck thread
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["complete"] is False and report["exitstatus"] == 70
    by_id = {t["nodeid"]: t for t in report["tests"]}
    assert [f["code"] for f in by_id["test_hang.py::test_a_leaks_a_thread"]["findings"]] == [
        "thread-leak"
    ]
    hung = by_id["test_hang.py::test_b_hangs"]
    assert [f["code"] for f in hung["findings"]] == ["shutdown-budget"]
    assert hung["budget"]["hung"] is True
    assert any(f"in {fixture}" in t["stack"] or fixture in t["stack"]
               for t in hung["budget"]["threads"])


@pytest.mark.long_running(10)
def test_an_engine_shutdown_cut_short_by_the_budget_is_shutdown_budget_not_raised(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("torch")
    pytester.makepyfile(
        """
        import time

        def test_shutdown_hangs(engine_manager):
            engine_manager.shutdown = lambda timeout=None: time.sleep(60)
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-platform=cpu", "--shutdown-budget=2",
        "--shutdown-report=r.json",
        timeout=120,
    )
    result.assert_outcomes(passed=1, errors=1)
    (record,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    codes = [f["code"] for f in record["findings"]]
    assert "shutdown-raised" not in codes
    assert codes.count("shutdown-budget") == 2, codes  # the fixture's call and the teardown
    assert any(
        "EngineProcManager.shutdown() call 1 was interrupted" in f["message"]
        for f in record["findings"]
    )
    assert "force-killed" in codes  # the engine processes, killed at the budget


def test_a_leak_after_a_pytest_timeout_is_not_said_to_have_had_a_grace(
    pytester: pytest.Pytester, child_script: str
) -> None:
    pytester.makepyfile(
        test_timeout=textwrap.dedent(
            f"""
            import subprocess, sys, time

            def test_body_hangs_with_a_child():
                subprocess.Popen([sys.executable, "-c", "{child_script}"])
                time.sleep(30)
            """
        )
    )
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--timeout=2", "--shutdown-report=r.json", timeout=90
    )
    result.assert_outcomes(failed=1)
    (record,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    (finding,) = record["findings"]
    assert finding["code"] == "process-leak"
    assert "(no grace was given)" in finding["message"]
    assert "grace:" not in finding["message"] and finding["details"]["grace_s"] == 0.0


@pytest.mark.long_running(10)
def test_an_in_process_engine_cut_short_by_the_budget_is_not_said_to_have_raised(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("torch")
    pytester.makepyfile(
        """
        import time

        def test_shutdown_hangs(engine_core):
            real = engine_core.shutdown
            engine_core.shutdown = lambda: (real(), time.sleep(60))  # released, then hangs
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-platform=cpu", "--shutdown-budget=5",
        "--shutdown-report=r.json",
        timeout=120,
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ShutdownBudgetExceeded: shutdown budget of 5 s exceeded*"])
    (record,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    assert [f["code"] for f in record["findings"]] == ["shutdown-budget"]


IDEMPOTENCE_HANG = """
import time
import pytest
from pytest_shutdown import assert_idempotent_shutdown

class Engine:
    def shutdown(self):
        time.sleep(60)

@pytest.fixture
def engine():
    yield Engine()
    assert_idempotent_shutdown(Engine())

def test_uses_engine(engine):
    pass
"""


def test_a_hang_under_the_idempotence_check_errors_the_test_not_the_run(
    pytester: pytest.Pytester,
) -> None:
    # The check's profile hook and its reset of CPython 3.11's async-exception flag came right
    # after the budget started its watchdog: the run ended with exit code 70 (stuck handler).
    pytester.makepyfile(test_idem=IDEMPOTENCE_HANG)
    result = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-budget=1", timeout=60)
    assert result.ret == 1, result.stderr.str()[-2000:]
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ShutdownBudgetExceeded: shutdown budget of 1 s exceeded*"])
