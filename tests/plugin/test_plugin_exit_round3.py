"""Issue 46, round 3: the guard's own escape routes at the end of a test and of the run.

* ``sys.exit()`` in a fixture's teardown: pytest reports an error, skips the finalizers still
  due and goes on; the guard still checks the test (no grace) and records it, and the report
  says the run's teardowns were cut short (``complete: false``).
* Warn mode, a non-daemon thread a test left that never ends: the interpreter's exit waits for
  it, as plain pytest's does; while it waits, the report says so (``exit_blocked_by``,
  ``complete: false``), and once the thread ended and the process exits, it says complete.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from inner_runs import ARGS

SYS_EXIT_IN_TEARDOWN = textwrap.dedent(
    """
    import os, pathlib, subprocess, sys
    import pytest

    @pytest.fixture
    def exits():
        yield
        sys.exit(3)

    def test_leaves(exits):
        os.environ["ROUND3_SYS_EXIT_X"] = "1"
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        pathlib.Path("child.pid").write_text(str(child.pid))

    def test_after():
        pathlib.Path("env-after").write_text(os.environ.get("ROUND3_SYS_EXIT_X", "unset"))
    """
)


def _child_running(pid_file: Path) -> int | None:
    """The inner test's sleeping child's pid while it runs (not a pid the host reused since;
    a zombie has no command line)."""
    if not pid_file.exists():
        return None
    pid = int(pid_file.read_text())
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if b"time.sleep(30)" in cmdline else None


def _kill_if_ours(pid_file: Path) -> None:
    """The inner test's sleeping child, if it is still there (warn mode leaves it)."""
    pid = _child_running(pid_file)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("mode", ["fail", "warn"])
def test_sys_exit_in_a_fixture_teardown_still_checks_and_records_the_test(
    pytester: pytest.Pytester, mode: str
) -> None:
    pytester.makepyfile(test_six=SYS_EXIT_IN_TEARDOWN)
    try:
        result = pytester.runpytest_subprocess(
            *ARGS, f"--shutdown-guard={mode}", "--shutdown-report=r.json", timeout=120
        )
        child = _child_running(pytester.path / "child.pid")
    finally:
        _kill_if_ours(pytester.path / "child.pid")
    output = result.stdout.str()
    # pytest itself: an error in teardown, the session goes on, exit status 1
    assert result.ret == 1, output
    result.assert_outcomes(passed=2, errors=1)
    log = _log(pytester.path / "r.records.jsonl")
    records = [e["record"] for e in log if e["type"] == "record"]
    mine = [r for r in records if r["nodeid"] == "test_six.py::test_leaves"]
    assert len(mine) == 1, records  # the test's record is in the record log
    record = mine[0]
    assert record["reported"] is False  # its findings go with its teardown error
    assert "SystemExit" in record["cut_short"]
    codes = {f["code"] for f in record["findings"]}
    assert "process-leak" in codes, record
    assert any("ROUND3_SYS_EXIT_X" in json.dumps(f) for f in record["findings"]), record
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["exitstatus"] == result.ret  # what pytest returned
    assert report["complete"] is False
    assert "cut short by SystemExit" in report["incomplete"], report["incomplete"]
    assert "test_six.py::test_leaves" in report["incomplete"]
    assert report["interrupted"] is False  # pytest went on with the next test
    assert [r["nodeid"] for r in report["tests"] if r["nodeid"].startswith("test_six")] == [
        "test_six.py::test_leaves"
    ]
    assert "process-leak" in output and "ROUND3_SYS_EXIT_X" in output
    env_after = (pytester.path / "env-after").read_text()
    if mode == "fail":  # order restored for the next test: the child killed, the env undone
        assert env_after == "unset"
        assert child is None  # killed when the test was checked, not left to the session end
        assert "<session end>" not in output
    else:  # warn mode changes nothing in the run
        assert env_after == "1"
        assert child is not None


BLOCKS_THE_EXIT = textwrap.dedent(
    """
    import pathlib, threading, time

    def wait_for_release():
        deadline = time.monotonic() + 120  # never forever, even if the outer test died
        while not pathlib.Path("release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def test_leaves_a_non_daemon_thread():
        threading.Thread(target=wait_for_release, name="waits-for-release").start()
    """
)


def _final_report(path: Path, run: subprocess.Popen[str], deadline: float) -> dict[str, Any]:
    """The report the session's end wrote (not the one written at its start), read while the
    process may still be running."""
    while time.monotonic() < deadline:
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            document = None
        if document is not None and "in_progress" not in document:
            return document
        if run.poll() is not None:
            break
        time.sleep(0.05)
    pytest.fail(f"no final report (exit status {run.poll()})")


def test_warn_mode_report_says_the_exit_is_blocked_while_it_is(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nine=BLOCKS_THE_EXIT)
    release = pytester.path / "release"
    command = [sys.executable, "-m", "pytest", *ARGS, "--shutdown-guard=warn"]
    command.append("--shutdown-report=r.json")
    run = pytester.popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    try:
        report = _final_report(pytester.path / "r.json", run, time.monotonic() + 60)
        assert run.poll() is None  # the exit waits for the thread, as plain pytest's does
        assert report["complete"] is False, report
        assert "has not exited" in report["incomplete"], report["incomplete"]
        assert "waits-for-release" in report["incomplete"]
        assert report["exitstatus"] == 0  # what pytest returns once the thread ended
        blocked = report["exit_blocked_by"]
        assert [t["name"] for t in blocked] == ["waits-for-release"], blocked
        assert "test_nine.py" in blocked[0]["started_at"]
        assert blocked[0]["started_in"] == "test_nine.py::test_leaves_a_non_daemon_thread"
        end = _log(pytester.path / "r.records.jsonl")[-1]
        assert end["type"] == "end" and end["exit_blocked_by"][0]["name"] == "waits-for-release"
        release.write_text("")  # the thread ends: the exit goes on
        out, _ = run.communicate(timeout=60)
    finally:
        release.write_text("")
        if run.poll() is None:
            run.kill()
            run.wait(10)
    assert run.returncode == 0, out
    after = json.loads((pytester.path / "r.json").read_text())
    assert after["complete"] is True, after  # the process got past the join: a clean end
    assert after["exit_blocked_by"] == []
    assert after["exitstatus"] == 0
    assert _log(pytester.path / "r.records.jsonl")[-1]["type"] == "exit_unblocked"
