"""Warn mode waits for no grace (issue 44 item 5): a test's candidate leaks are confirmed while
the next tests run, and reported against the test they belong to; fail mode still waits."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: A child that never ends by itself (the outer test kills it by the pid file it leaves).
FOREVER = "import time\\nwhile True: time.sleep(1)"

MIXED = textwrap.dedent(
    f"""
    import os, subprocess, sys, threading, time

    def test_short_thread():
        threading.Thread(target=time.sleep, args=(0.5,), name="short-lived", daemon=True).start()

    def test_forever_process():
        proc = subprocess.Popen([sys.executable, "-c", "{FOREVER}"])
        with open(os.path.join(os.environ["PIDS"], f"{{proc.pid}}.pid"), "w") as f:
            f.write(str(proc.pid))

    def test_after_1():
        time.sleep(0.4)

    def test_after_2():
        time.sleep(0.4)

    def test_after_3():
        time.sleep(0.4)

    def test_after_4():
        time.sleep(0.4)
    """
)


@pytest.fixture
def pids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder where the inner suite leaves its never-ending children's pids: killed here."""
    folder = tmp_path / "pids"
    folder.mkdir()
    monkeypatch.setenv("PIDS", str(folder))
    yield folder
    for path in folder.glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(path.read_text()), signal.SIGKILL)


def _tests(report: dict[str, object]) -> dict[str, list[str]]:
    """Node id -> finding codes, less the session-end sweep's (what is still running then)."""
    tests = report["tests"]
    assert isinstance(tests, list)
    return {
        t["nodeid"]: [f["code"] for f in t["findings"]]
        for t in tests
        if t["nodeid"] != "<session end>"
    }


@pytest.mark.parametrize("workers", [[], ["-n", "2", "--dist=loadfile"]], ids=["single", "xdist"])
def test_warn_mode_confirms_later_against_the_leaking_test(
    pytester: pytest.Pytester, pids: Path, workers: list[str]
) -> None:
    if workers:
        pytest.importorskip("xdist")
    pytester.makepyfile(test_mixed=MIXED)
    result = pytester.runpytest_subprocess(
        "--shutdown-guard=warn", "--shutdown-grace=1", "--shutdown-report=r.json",
        "-p", "no:randomly", *workers,
    )
    result.assert_outcomes(passed=6, warnings=1)
    out = result.stdout.str()
    # The never-ending process, confirmed after its grace while later tests ran, is listed
    # under its own test in the summary (once) and in the JSON report; the thread that ended
    # 0.5 s later, within the grace, is not reported at all.
    # (It is still running at session end, so the session-end sweep lists it too, as before.)
    result.stdout.fnmatch_lines(["test_mixed.py::test_forever_process*: [[]process-leak]*"])
    summary = out.split("= shutdown =")[1]
    assert summary.count("test_mixed.py::test_forever_process") == 1
    assert "short-lived" not in out and "thread-leak" not in out
    assert "leaked by test_mixed.py::test_forever_process" in out
    # Confirmed at a later test's check (its grace ran out during test_after_3), not at
    # session end: pytest lists the warning under that test; under xdist the record travelled
    # with that test's teardown report.
    assert re.search(r"^test_mixed.py::test_after_[34]$", out, re.MULTILINE), out
    report = json.loads((pytester.path / "r.json").read_text())
    assert _tests(report) == {"test_mixed.py::test_forever_process": ["process-leak"]}
    assert report["complete"] is True
    assert report["summary"]["tests"] == 6  # the deferred record is not a seventh test


def test_warn_mode_waits_no_grace_per_leaking_test(pytester: pytest.Pytester) -> None:
    """Ten tests that each leak a thread ending 1.5 s later, grace 2 s, then a test of 2.5 s
    (the graces run out during it): the old synchronous grace cost ~1.5 s a leaking test
    (> 15 s in all); now the run takes well under 10 s, even on a busy machine, and nothing is
    reported (each thread ended within its grace)."""
    pytester.makepyfile(
        test_many=textwrap.dedent(
            """
            import threading, time
            import pytest

            @pytest.mark.parametrize("n", range(10))
            def test_leak(n):
                threading.Thread(target=time.sleep, args=(1.5,), daemon=True).start()

            def test_slow():
                time.sleep(2.5)
            """
        )
    )
    start = time.monotonic()
    result = pytester.runpytest_subprocess(
        "--shutdown-guard=warn", "--shutdown-grace=2", "-p", "no:randomly"
    )
    elapsed = time.monotonic() - start
    result.assert_outcomes(passed=11)
    result.stdout.fnmatch_lines(["*no findings in 11 tests (guard in warn mode, grace 2 s)*"])
    assert elapsed < 10.0, f"the run took {elapsed:.1f} s: a grace waited per leaking test?"


def test_warn_mode_waits_for_nothing_at_session_end(pytester: pytest.Pytester) -> None:
    """The last test's thread, still running when the session ends and 20 s from its end, is
    reported with its test as still running then, how far into its 30 s grace; the run does not
    wait for it (the old session-end wait took up to the rest of the grace: 20 s here)."""
    pytester.makepyfile(
        test_last=textwrap.dedent(
            """
            import threading, time

            def test_leaks_last():
                threading.Thread(
                    target=time.sleep, args=(20,), name="slow-end", daemon=True
                ).start()
            """
        )
    )
    start = time.monotonic()
    result = pytester.runpytest_subprocess(
        "--shutdown-guard=warn", "--shutdown-grace=30", "--shutdown-report=r.json",
        "-p", "no:randomly",
    )
    elapsed = time.monotonic() - start
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*ShutdownLeakWarning: [[]thread-leak] 1 thread started in test_leaks_last still"
            " running when the session ended, * s into its 30 s grace: 'slow-end' (target "
            "time.sleep, started by *).",
            "*(leaked by test_last.py::test_leaks_last: still running when the session ended,"
            " before its grace ran out)",
        ]
    )
    assert elapsed < 15.0, f"the run took {elapsed:.1f} s: the session end waited the grace?"
    report = json.loads((pytester.path / "r.json").read_text())
    (finding,) = [f for t in report["tests"] for f in t["findings"]]
    assert finding["details"]["session_end"] is True
    assert 0 <= finding["details"]["waited_s"] < 15


def test_the_last_tests_leak_is_confirmed_at_session_end(
    pytester: pytest.Pytester, pids: Path
) -> None:
    pytester.makepyfile(
        test_last=textwrap.dedent(
            f"""
            import os, subprocess, sys, threading

            _release = threading.Event()

            def test_clean():
                pass

            def test_leaks_last():
                threading.Thread(target=_release.wait, name="stuck", daemon=True).start()
                proc = subprocess.Popen([sys.executable, "-c", "{FOREVER}"])
                with open(os.path.join(os.environ["PIDS"], f"{{proc.pid}}.pid"), "w") as f:
                    f.write(str(proc.pid))
            """
        )
    )
    result = pytester.runpytest_subprocess(
        "--shutdown-guard=warn", "--shutdown-grace=0.5", "--shutdown-report=r.json",
        "-p", "no:randomly",
    )
    result.assert_outcomes(passed=2, warnings=1)  # one warning for the test's findings
    result.stdout.fnmatch_lines(
        [
            "*ShutdownLeakWarning: [[]thread-leak] 1 thread started in test_leaks_last*",
            "*[[]process-leak] 1 child process started in test_leaks_last*",
            "*(leaked by test_last.py::test_leaks_last: still running when the session ended*",
            "test_last.py::test_leaks_last: [[]*",
            "test_last.py::test_leaks_last: [[]*",
        ]
    )
    report = json.loads((pytester.path / "r.json").read_text())
    codes = _tests(report)
    assert sorted(codes["test_last.py::test_leaks_last"]) == ["process-leak", "thread-leak"]
    assert list(codes) == ["test_last.py::test_leaks_last"]
    # The durations count each test once (the deferred record is not a second test).
    assert report["summary"]["tests"] == 2


def test_fail_mode_still_errors_the_leaking_test(pytester: pytest.Pytester, pids: Path) -> None:
    pytester.makepyfile(test_mixed=MIXED)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-grace=1", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=6, errors=1)
    result.stdout.fnmatch_lines(
        ["ERROR test_mixed.py::test_forever_process - shutdown guard: [[]process-leak]*"]
    )
    assert "short-lived" not in result.stdout.str()  # it ended within the grace
