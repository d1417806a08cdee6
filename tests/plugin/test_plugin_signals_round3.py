"""Signals and the teardown budget, round 3 (issue 46, items 3, 5 and 12): a SIGTERM after Ctrl-C
in a session-scoped teardown, a test's own SIGALRM timer under the budget, and messages that
say only what is known (where the main thread is; a budget's time on a clock no test patches).

Each case is a real pytest run in a subprocess, checked from outside: its exit status, its
output and its report.
"""

from __future__ import annotations

import signal
import sys
import textwrap
import time

import pytest
from inner_runs import ARGS, finish, load_report, popen_pytest, start_reported_run, wait_for

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="SIGALRM, SO_PASSCRED, faulthandler.register"
)

# --- item 3: a SIGTERM while a session-scoped fixture tears down -----------------------------

SESSION_TEARDOWN = textwrap.dedent(
    """
    import pathlib, time
    import pytest

    @pytest.fixture(scope="session")
    def slow_session():
        yield
        pathlib.Path("tearing").write_text("yes")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)

    def test_runs(slow_session):
        if pathlib.Path("wait").exists():  # wait here for the Ctrl-C
            pathlib.Path("running").write_text("yes")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.05)
    """
)


@pytest.mark.parametrize(
    ("ctrl_c_first", "status"),
    [(True, 143), (False, 2)],
    ids=["ctrl-c-then-sigterm", "sigterm"],
)
def test_a_sigterm_in_a_session_teardown_ends_the_run_with_one_status(
    pytester: pytest.Pytester, ctrl_c_first: bool, status: int
) -> None:
    """After a Ctrl-C, pytest tears the session down after its test loop, where it no longer
    takes an interrupt: the SIGTERM ends the process at once (143). Without one, the session
    is torn down in the last test's teardown, in the loop: the session ends in order (2)."""
    pytester.makepyfile(test_session=SESSION_TEARDOWN)
    if ctrl_c_first:
        (pytester.path / "wait").write_text("yes")
    proc = popen_pytest(pytester, *ARGS, "--shutdown-report=r.json")
    if ctrl_c_first:
        wait_for(pytester.path / "running", proc, "the test body")
        proc.send_signal(signal.SIGINT)
    wait_for(pytester.path / "tearing", proc, "the session-scoped teardown")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    returncode, out = finish(proc)
    took = time.monotonic() - sent
    assert returncode == status, out
    assert took < 10, f"ended {took:.1f} s after the SIGTERM"
    assert "Traceback (most recent call last)" not in out, out
    if ctrl_c_first:
        assert "SigtermInterrupted" not in out, out
        assert "pytest's test loop was over" in out, out
        assert f"exit code {status} +++" in out, out
    report = load_report(pytester)
    assert report["complete"] is False, report
    assert report["exitstatus"] == status, report


# --- item 5: the test's own SIGALRM timer does not disable the budget -------------------------

OWN_TIMER = textwrap.dedent(
    """
    import pathlib, signal, time
    import pytest

    TICKS = []

    def _tick(signum, frame):
        TICKS.append(signum)

    @pytest.fixture
    def sleeps():
        yield
        time.sleep(40)

    def test_arms_its_own_timer(sleeps):
        signal.signal(signal.SIGALRM, _tick)
        ARM

    def test_next():
        # As without the plugin: the test's handler is still in place, and its timer went off
        # (during the teardown) into that handler.
        assert signal.getsignal(signal.SIGALRM) is _tick
        deadline = time.monotonic() + 10
        while not TICKS and time.monotonic() < deadline:
            time.sleep(0.01)
        assert TICKS, "the test's own timer never reached its handler"
        if PERIODIC:  # still ticking
            assert signal.getitimer(signal.ITIMER_REAL)[1] == pytest.approx(0.2)
            seen = len(TICKS)
            while len(TICKS) == seen and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(TICKS) > seen, "the test's periodic timer stopped"
        signal.setitimer(signal.ITIMER_REAL, 0)
    """
)


@pytest.mark.parametrize(
    ("arm", "periodic"),
    [("signal.alarm(1)", False), ("signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)", True)],
    ids=["alarm", "periodic-setitimer"],
)
def test_the_budget_fires_whatever_timer_the_test_armed(
    pytester: pytest.Pytester, arm: str, periodic: bool
) -> None:
    source = OWN_TIMER.replace("ARM", arm).replace("PERIODIC", str(periodic))
    pytester.makepyfile(test_timer=source)
    start = time.monotonic()
    result = pytester.runpytest_subprocess(
        *ARGS,
        "--shutdown-guard=warn",
        "--shutdown-budget=3",
        "--shutdown-report=r.json",
        timeout=120,
    )
    took = time.monotonic() - start
    out = result.stdout.str()
    assert took < 15, f"the run took {took:.1f} s with a 3 s budget:\n{out}"
    assert "ShutdownBudgetExceeded: shutdown budget of 3 s" in out, out
    report = load_report(pytester)
    assert report["summary"]["budgets_exceeded"] == 1, report
    codes = {t["nodeid"]: [f["code"] for f in t["findings"]] for t in report["tests"]}
    assert "shutdown-budget" in codes.get("test_timer.py::test_arms_its_own_timer", []), codes
    assert result.parseoutcomes().get("failed", 0) == 0, out  # test_next: as without the plugin


# --- item 12 (a): the watcher says where the main thread is, and nothing it does not know -----

SLOW_FINALLY = textwrap.dedent(
    """
    import pathlib, time

    def test_slow_finally():
        pathlib.Path("running").write_text("yes")
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            time.sleep(30)
    """
)


def test_a_slow_finally_after_ctrl_c_is_not_said_to_be_blocked_in_c(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_finally=SLOW_FINALLY)
    proc = start_reported_run(pytester, "running", "the test body")
    proc.send_signal(signal.SIGINT)
    returncode, out = finish(proc)
    assert returncode == 130, out
    line = next((x for x in out.splitlines() if x.startswith("+++ pytest-shutdown: SIGINT")), "")
    assert line, out
    assert "blocked in a C call" not in line, line
    assert "did not take it" not in line, line  # whether Python's handler ran is not known
    assert "test_finally.py:10 in test_slow_finally" in line, line
    assert "time.sleep(30)" in line, line


# --- item 12 (b): a budget's time on a clock no test patches ----------------------------------

FROZEN_CLOCK = textwrap.dedent(
    """
    import time
    import pytest

    @pytest.fixture
    def sleeps():
        yield
        time.sleep(30)

    def test_frozen(monkeypatch, sleeps):
        monkeypatch.setattr(time, "monotonic", lambda: 1000.0)  # freezegun does the same
    """
)


def test_a_budget_on_a_frozen_clock_says_the_real_time(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_frozen=FROZEN_CLOCK)
    result = pytester.runpytest_subprocess(
        *ARGS, "--shutdown-budget=1", "--shutdown-report=r.json", timeout=90
    )
    out = result.stdout.str()
    assert "ShutdownBudgetExceeded: shutdown budget of 1 s" in out, out
    report = load_report(pytester)
    (test,) = [t for t in report["tests"] if t["nodeid"] == "test_frozen.py::test_frozen"]
    assert 0.8 < test["budget"]["elapsed_s"] < 10, test["budget"]
    assert "after 0.00 s" not in out, out


FROZEN_THEN_STUCK_IN_C = textwrap.dedent(
    """
    import ctypes, pathlib, time

    def test_freezes_the_clock_then_deadlocks_in_c():
        time.monotonic = lambda: 1000.0  # frozen for good: the test never gets back
        libc = ctypes.CDLL(None)
        mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
        libc.pthread_mutex_lock(mutex)
        pathlib.Path("stuck").write_text("yes")
        libc.pthread_mutex_lock(mutex)  # a default mutex locked twice: never returns
    """
)


def test_the_signal_watcher_keeps_its_deadline_on_a_frozen_clock(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_stuck=FROZEN_THEN_STUCK_IN_C)
    proc = start_reported_run(pytester, "stuck", "the C deadlock")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    returncode, out = finish(proc, timeout=40)
    took = time.monotonic() - sent
    assert returncode == 143, out
    assert took < 30, f"ended after {took:.1f} s"
    line = next((x for x in out.splitlines() if x.startswith("+++ pytest-shutdown: SIGTERM")), "")
    assert "did not take it within 5 s: it is in a call into C from test_stuck.py:9" in line, out
    assert "libc.pthread_mutex_lock(mutex)" in line, line
