"""The guard's fast path on real runs: a clean test costs one fingerprint pass before and one
after, and the next test starts from the last clean baseline only when nothing moved in between.
Both sides: what happens between two tests is neither test's, and a leak right after a row of
clean tests (each starting from the reused baseline) is still found, on the right test."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

GRACE = "--shutdown-grace=0.3"

BETWEEN_TESTS = textwrap.dedent(
    """
    import os, threading

    import pytest

    _stop = threading.Event()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(nodeid):
        # Between two tests (after the guard's check of one, before the next one's set-up):
        # a thread and a descriptor nobody holds, neither test's doing.
        # After a test that moved nothing, and after one whose check had to ask every kind
        # (its baseline for the next test then taken at the end of that check).
        for name in ("test_clean_first", "test_clean_after_the_gap"):
            if nodeid.endswith(name):
                threading.Thread(
                    target=_stop.wait, args=(30,), name=f"between-{name}", daemon=True
                ).start()
                os.open(__file__, os.O_RDONLY)

    def pytest_unconfigure(config):
        _stop.set()
    """
)

SUITE = textwrap.dedent(
    """
    import os, threading

    _stop = threading.Event()

    def test_clean_first():
        pass

    def test_clean_after_the_gap():
        # moves the fingerprints (a pid allocated), so every kind is asked against the baseline
        t = threading.Thread(target=len, args=((),))
        t.start()
        t.join()

    def test_clean_again():
        pass

    def test_leaks_a_thread_and_a_descriptor():
        threading.Thread(target=_stop.wait, args=(30,), name="mine", daemon=True).start()
        os.open(__file__, os.O_RDONLY)

    def test_clean_last():
        # (does not stop 'mine': in warn mode it is confirmed once its grace ran out, at
        # session end here; stopped now it would have ended within its grace, not a leak)
        pass
    """
)


@pytest.mark.parametrize("mode", ["fail", "warn"])
def test_what_starts_between_tests_is_no_tests_and_a_later_leak_is_found(
    pytester: pytest.Pytester, mode: str
) -> None:
    pytester.makeconftest(BETWEEN_TESTS)
    pytester.makepyfile(test_gap=SUITE)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", f"--shutdown-guard={mode}", GRACE, "-p", "no:randomly", "-v"
    )
    out = result.stdout.str()
    if mode == "fail":
        result.assert_outcomes(passed=5, errors=1)
        result.stdout.fnmatch_lines(
            ["ERROR test_gap.py::test_leaks_a_thread_and_a_descriptor - shutdown guard: *"]
        )
    else:
        result.assert_outcomes(passed=5, warnings=1)
    assert "thread-leak" in out and "fd-leak" in out
    assert "'mine'" in out
    for clean in ("test_clean_first", "test_clean_after_the_gap", "test_clean_again"):
        assert f"ERROR at teardown of {clean}" not in out
        assert f"{clean} - shutdown guard" not in out
    assert "findings in 1 of 5 tests" in out or "1 of 5 tests" in out


ALLOWED_THEN_CLEAN = textwrap.dedent(
    """
    import threading

    import pytest

    _stop = threading.Event()

    @pytest.mark.allow_leaks(threads=True, reason="kept on purpose")
    def test_allowed_to_leave_a_thread():
        threading.Thread(target=_stop.wait, args=(30,), name="allowed", daemon=True).start()

    def test_clean_next():
        # moves the fingerprints: every kind is asked against the baseline it started from
        t = threading.Thread(target=len, args=((),))
        t.start()
        t.join()

    def test_clean_last():
        _stop.set()
    """
)


@pytest.mark.parametrize("mode", ["fail", "warn"])
def test_what_an_allowed_test_left_is_in_the_next_tests_baseline(
    pytester: pytest.Pytester, mode: str
) -> None:
    """A check that had to ask every kind and found nothing to report (an allowed leak) is the
    next test's baseline: taken then, with what the allowed test left in it."""
    pytester.makepyfile(test_allowed=ALLOWED_THEN_CLEAN)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", f"--shutdown-guard={mode}", GRACE, "-p", "no:randomly", "-v"
    )
    result.assert_outcomes(passed=3)
    assert "thread-leak" not in result.stdout.str()


def test_the_guards_error_is_reported_by_its_text_not_a_formatted_traceback(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard replaces its teardown error's report with the findings: pytest must not first
    format the traceback through its and pluggy's frames (tens of milliseconds per error,
    thrown away). The error is still a ShutdownContractError."""
    from _pytest._code.code import ExceptionInfo

    from pytest_shutdown import ShutdownContractError

    styles: list[str] = []
    real = ExceptionInfo.getrepr

    def recording(self, *args, **kwargs):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN002, ANN003, ANN202
        if isinstance(self.value, ShutdownContractError):
            styles.append(kwargs.get("style", "long"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ExceptionInfo, "getrepr", recording)
    pytester.makepyfile(
        """
        import atexit

        class Holder:
            def close(self):
                pass

        def test_registers():
            atexit.register(Holder().close)
        """
    )
    result = pytester.runpytest_inprocess("-p", "shutdown", "--tb=long", "-p", "no:randomly")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*shutdown guard: [[]atexit-holds-object]*"])
    assert styles == ["value"]


# --- quiet gaps: a set-up that trusts the gap before it reads nothing ---

COUNT_READINGS = textwrap.dedent(
    """
    import sys

    import pytest

    from pytest_shutdown._fast import marks

    READS = [0]
    _read = marks.FingerprintPass.read

    def counting(self):
        READS[0] += 1
        return _read(self)

    marks.FingerprintPass.read = counting

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(config):
        sys.stdout.write(f"\\nreadings: {READS[0]}\\n")
    """
)


A_PID_IN_EVERY_GAP = textwrap.dedent(
    """
    import subprocess

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(nodeid):
        subprocess.run(["true"], check=True)  # a pid taken, and given back, between two tests
    """
)


@pytest.mark.parametrize(
    ("timeout", "gap"),
    [([], ""), (["--timeout=30", "--timeout-method=signal"], ""), ([], A_PID_IN_EVERY_GAP)],
    ids=["plain", "pytest-timeout", "a pid in every gap"],
)
def test_after_quiet_gaps_a_clean_test_costs_one_reading_and_a_later_leak_is_found(
    pytester: pytest.Pytester, timeout: list[str], gap: str
) -> None:
    """Forty clean tests: every teardown reads; the set-ups read until eight gaps in a row were
    quiet, then only every eighth one (a probe): 40 + 9 + 4 readings, not 80. A leak made
    after the gaps are trusted is still found, on its test. Quiet as well: a gap in which
    pytest-timeout's signal method installs a new SIGALRM handler (a test tool's handler is one
    placeholder in the fingerprint), and one in which a pid is taken (here, by a process that
    has ended; on a busy host, by anyone): the kinds behind that reading see what they saw."""
    pytester.makeconftest(COUNT_READINGS + gap)
    pytester.makepyfile(
        test_quiet=textwrap.dedent(
            """
            import threading

            import pytest

            _stop = threading.Event()

            @pytest.mark.parametrize("n", range(40))
            def test_clean(n):
                pass

            def test_leaks_after_the_quiet_gaps():
                threading.Thread(target=_stop.wait, args=(30,), name="late", daemon=True).start()

            def test_last():
                _stop.set()
            """
        )
    )
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", GRACE, "-p", "no:randomly", "-s", *timeout
    )
    result.assert_outcomes(passed=42, errors=1)
    result.stdout.fnmatch_lines(
        ["*test_leaks_after_the_quiet_gaps still running after the 0.3 s grace: 'late'*"]
    )
    readings = int(result.stdout.str().rpartition("readings: ")[2].split()[0])
    # 42 teardowns; set-ups 1-9, the probes 16, 24, 32 and 40, and 42 (after the leak)
    assert 42 + 14 <= readings <= 42 + 16, readings


WATCHDOG_IN_THE_GAP = textwrap.dedent(
    """
    import threading

    import pytest

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        # Armed before the set-up, disarmed after the teardown (as pytest-timeout's thread
        # method does): alive at every check, and a new one in every gap.
        stop = threading.Event()
        watchdog = threading.Thread(target=stop.wait, args=(30,), name="watchdog", daemon=True)
        watchdog.start()
        try:
            return (yield)
        finally:
            stop.set()
            watchdog.join(5)
    """
)


def assert_30_clean_tests_have_no_findings(pytester: pytest.Pytester, *options: str) -> None:
    """A run of 30 tests that do nothing, with ``options``: they pass, and no finding."""
    pytester.makepyfile(
        test_clean=textwrap.dedent(
            """
            import pytest

            @pytest.mark.parametrize("n", range(30))
            def test_clean(n):
                pass
            """
        )
    )
    result = pytester.runpytest_subprocess(*options)
    result.assert_outcomes(passed=30)
    result.stdout.fnmatch_lines(["no findings in 30 tests*"])


@pytest.mark.parametrize("watchdog", ["faulthandler_timeout", "a hook's thread"])
def test_a_watchdog_armed_in_every_gap_is_no_tests_leak(
    pytester: pytest.Pytester, watchdog: str
) -> None:
    """What a plugin starts between tests and stops after the next one's teardown is in the
    baseline of that test: faulthandler's native watchdog (no origin recorded: the gaps move,
    so every set-up reads) and a thread a hook starts (recorded outside any test)."""
    options = ["-p", "shutdown", GRACE, "-p", "no:randomly"]
    if watchdog == "faulthandler_timeout":
        options += ["-o", "faulthandler_timeout=60"]
    else:
        pytester.makeconftest(WATCHDOG_IN_THE_GAP)
    assert_30_clean_tests_have_no_findings(pytester, *options)


THREAD_STARTED_IN_A_LATE_GAP = textwrap.dedent(
    """
    import threading

    import pytest

    _stop = threading.Event()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(nodeid):
        # Once, after the gaps are trusted: a thread a reporting hook starts and keeps.
        if nodeid.endswith("test_clean[20]"):
            threading.Thread(target=_stop.wait, args=(30,), name="uploader", daemon=True).start()

    def pytest_sessionfinish(session):
        _stop.set()
    """
)


def test_a_thread_a_hook_starts_in_a_trusted_gap_is_not_the_next_tests(
    pytester: pytest.Pytester,
) -> None:
    """A set-up that trusted the gap did not read it; what was started there through
    ``threading`` is recorded outside any test, and not the next test's leak."""
    pytester.makeconftest(THREAD_STARTED_IN_A_LATE_GAP)
    assert_30_clean_tests_have_no_findings(pytester, "-p", "shutdown", GRACE, "-p", "no:randomly")


#: A session fixture's child process, alive through every test (a suite's own server).
SESSION_SERVER = textwrap.dedent(
    """
    import subprocess, sys, threading

    import pytest

    CHILD = "import sys\\nsys.stdin.read()"

    @pytest.fixture(scope="session")
    def server():
        proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE)
        yield proc
        proc.stdin.close()
        proc.wait(timeout=30)
    """
)

SERVER_AND_A_THREAD_PER_TEST = SESSION_SERVER + textwrap.dedent(
    """
    @pytest.mark.parametrize("n", range(12))
    def test_thread(server, n):
        t = threading.Thread(target=len, args=((),))
        t.start()
        t.join()

    def test_leaks_a_process(server):
        subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE)

    def test_thread_after(server):
        t = threading.Thread(target=len, args=((),))
        t.start()
        t.join()
    """
)


def test_a_thread_per_test_beside_a_server_is_clean_and_a_new_process_still_found(
    pytester: pytest.Pytester,
) -> None:
    """Pids allocated only to threads the tests start and join: the descendants' last walk
    stands and the check is clean without asking a kind; a process started later moves the
    readings past those threads and is found, on its test."""
    pytester.makepyfile(test_server=SERVER_AND_A_THREAD_PER_TEST)
    result = pytester.runpytest_subprocess("-p", "shutdown", GRACE, "-p", "no:randomly", "-v")
    result.assert_outcomes(passed=14, errors=1)
    result.stdout.fnmatch_lines(["*test_leaks_a_process*process-leak*"])
    out = result.stdout.str()
    assert "ERROR at teardown of test_thread" not in out
    assert "1 of 14 tests with findings" in out


A_CHILD_PER_TEST_BESIDE_A_SERVER = SESSION_SERVER + textwrap.dedent(
    """
    import os, time

    # Bound, then says so through a file: no pipe to the test, so that only the new
    # descendant (not a descriptor of the pytest process) moves the ports kind.
    BINDS = (
        "import os, socket, sys, time\\n"
        "s = socket.create_server(('127.0.0.1', 0))\\n"
        "open(sys.argv[1], 'w').close()\\n"
        "time.sleep(60)"
    )

    @pytest.mark.parametrize("n", range(12))
    def test_a_child_started_and_reaped(server, n):
        subprocess.run(["true"], check=True)  # a pid taken and given back: the descendants stay

    def test_a_child_left_holding_a_port(server):
        bound = os.path.abspath("bound")  # (no fixture: a new wider-scope one resets the marks)
        subprocess.Popen([sys.executable, "-c", BINDS, bound])
        deadline = time.monotonic() + 30
        while not os.path.exists(bound) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.path.exists(bound)

    def test_last(server):  # the server's teardown (all kinds asked) comes after the leak's check
        pass
    """
)

#: A conftest's note of the test now running (its set-up, call and teardown, and the guard's
#: check inside them): ``CURRENT[0]``.
CURRENT_TEST = textwrap.dedent(
    """
    import sys

    import pytest

    CURRENT = [""]

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(item, nextitem):
        CURRENT[0] = item.name  # the guard's set-up and check run inside
        try:
            return (yield)
        finally:
            CURRENT[0] = ""
    """
)

COUNT_PORT_LISTINGS = CURRENT_TEST + textwrap.dedent(
    """
    from pytest_shutdown.resources import ports

    LISTINGS = []
    _new_ports = ports.new_ports

    def counting(before):
        LISTINGS.append(CURRENT[0])
        return _new_ports(before)

    ports.new_ports = counting

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(config):
        # the first test's are the server fixture's (what it started, then absorbed)
        later = [t for t in LISTINGS if "reaped" in t and not t.endswith("[0]")]
        sys.stdout.write(f"\\nport listings: {len(later)} in the later reaping tests\\n")
    """
)


def test_a_pid_taken_and_given_back_lists_no_ports_and_a_childs_port_is_still_found(
    pytester: pytest.Pytester,
) -> None:
    """A pid allocated during a test (a child started and reaped; on a busy host, any process's)
    moves the processes kind's reading, which the ports kind is fingerprinted by: while the
    descendants are the baseline's and the fd fingerprint did not move, no test lists every
    descendant's descriptors. A child left running with a bound port is still found, on its
    test, as a process and as a port."""
    pytester.makeconftest(COUNT_PORT_LISTINGS)
    pytester.makepyfile(test_children=A_CHILD_PER_TEST_BESIDE_A_SERVER)
    result = pytester.runpytest_subprocess("-p", "shutdown", GRACE, "-p", "no:randomly", "-v")
    result.assert_outcomes(passed=14, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_a_child_left_holding_a_port*",
            "shutdown guard: [[]process-leak] *; [[]port-leak] *",
        ]
    )
    out = result.stdout.str()
    assert "ERROR at teardown of test_a_child_started_and_reaped" not in out
    assert "port listings: 0 in the later reaping tests" in out


#: Started by the outer test, not by the guarded session: on SIGUSR1 it starts a ``sleep``
#: (its own child, no descendant of the session), then notes its pid in the log.
SPAWNER = textwrap.dedent(
    """
    import signal, subprocess, sys, time

    log = sys.argv[1]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})
    children = []
    open(log, "w").close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        got = signal.sigtimedwait({signal.SIGUSR1, signal.SIGTERM}, 1.0)
        if got is None:
            continue
        if got.si_signo == signal.SIGTERM:
            break
        children.append(subprocess.Popen(["sleep", "5"]))
        with open(log, "a") as f:
            f.write(f"{children[-1].pid}\\n")
    for child in children:
        child.kill()
        child.wait()
    """
)

COUNT_WALKS_AND_LOOKUPS = CURRENT_TEST + textwrap.dedent(
    """
    from pytest_shutdown.resources import primitives as leaks

    WALKS = []
    LOOKUPS = []
    _walk, _parent_of = leaks._walk_descendants, leaks._parent_of

    def walking(pid):
        WALKS.append(CURRENT[0])
        return _walk(pid)

    def looking_up(pid):
        LOOKUPS.append(CURRENT[0])
        return _parent_of(pid)

    leaks._walk_descendants, leaks._parent_of = walking, looking_up

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(config):
        # the first test's are the server fixture's (what it started, then absorbed)
        later = lambda names: len(
            [t for t in names if "process_started_elsewhere[" in t and not t.endswith("[0]")]
        )
        sys.stdout.write(
            f"\\nwalks: {later(WALKS)}, lookups: {later(LOOKUPS)} in the later tests\\n"
        )
    """
)

ANOTHER_PROCESS_STARTS_ONE_PER_TEST = SESSION_SERVER + textwrap.dedent(
    """
    import _thread, os, signal, time

    LOCK = _thread.allocate_lock()
    LOCK.acquire()

    def started_elsewhere():
        log = os.environ["SPAWNER_LOG"]
        with open(log) as f:
            before = len(f.read().split())
        os.kill(int(os.environ["SPAWNER_PID"]), signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while True:
            with open(log) as f:
                if len(f.read().split()) > before:
                    return
            assert time.monotonic() < deadline, "the spawner did not answer"
            time.sleep(0.005)

    @pytest.mark.parametrize("n", range(12))
    def test_a_process_started_elsewhere(server, n):
        started_elsewhere()

    def test_leaks_a_process_beside_one_started_elsewhere(server):
        started_elsewhere()
        subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE)
        started_elsewhere()

    def test_leaks_a_native_thread_beside_one_started_elsewhere(server):
        started_elsewhere()
        _thread.start_new_thread(LOCK.acquire, ())
        started_elsewhere()

    def test_last(server):
        LOCK.release()
    """
)


def test_pids_another_process_allocates_are_looked_up_not_walked_and_a_leak_is_still_found(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """A host whose processes come and go (here: a process that is no descendant of the
    session starts one during each test) moves ``ns_last_pid``, which every process kind's
    reading is: each new pid is looked up (whose child is it?) instead of walking the
    descendants and listing the tasks again. A process and a native thread that a test
    leaves beside such a pid are still found, on their tests."""
    log = tmp_path / "spawned.log"
    spawner = subprocess.Popen([sys.executable, "-c", SPAWNER, str(log)])
    try:
        deadline = time.monotonic() + 30
        while not log.exists():
            assert time.monotonic() < deadline, "the spawner did not start"
            time.sleep(0.01)
        pytester.makeconftest(COUNT_WALKS_AND_LOOKUPS)
        pytester.makepyfile(test_elsewhere=ANOTHER_PROCESS_STARTS_ONE_PER_TEST)
        with pytest.MonkeyPatch.context() as env:
            env.setenv("SPAWNER_PID", str(spawner.pid))
            env.setenv("SPAWNER_LOG", str(log))
            result = pytester.runpytest_subprocess(
                "-p", "shutdown", GRACE, "-p", "no:randomly", "-v"
            )
    finally:
        spawner.terminate()
        try:
            spawner.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spawner.kill()
            spawner.wait(timeout=30)
    result.assert_outcomes(passed=15, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks_a_process_beside_one_started_elsewhere*",
            "shutdown guard: [[]process-leak]*",
            "*ERROR at teardown of test_leaks_a_native_thread_beside_one_started_elsewhere*",
            "shutdown guard: [[]thread-leak]*",
        ]
    )
    out = result.stdout.str()
    assert "ERROR at teardown of test_a_process_started_elsewhere" not in out
    assert len(log.read_text().split()) == 12 + 2 + 2
    walks, lookups = re.search(r"walks: (\d+), lookups: (\d+)", out).groups()  # type: ignore[union-attr]
    # Each of the 11 later tests' pids is looked up, none walked (a walk on the old path). A
    # burst of more than FOREIGN_LOOKUPS pids from elsewhere on a busy machine (another xdist
    # worker's pool) would still ask for one: a little room.
    assert int(walks) <= 2
    assert int(lookups) >= 11
