"""Issue 46: the report path never describes an earlier run, never takes a record log's name,
and a refused run (exit code 4) creates nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_shutdown.plugin.records import main, record_log_path

ARGS = ("-p", "shutdown", "-p", "no:randomly", "--shutdown-grace=0.2")

QUICK = "def test_quick():\n    pass\n"
#: Writes the pytest process's pid, then waits to be killed (at most 120 s).
BLOCKS = textwrap.dedent(
    """
    import os, pathlib, time

    def test_blocks():
        pathlib.Path("pid").write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.1)
    """
)


def name_max(folder: Path) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def complete_first_run(pytester: pytest.Pytester, report: str = "r.json") -> dict:
    """Run 1: one passing test, a complete report at ``report``."""
    pytester.makepyfile(test_quick=QUICK)
    result = pytester.runpytest_subprocess(*ARGS, f"--shutdown-report={report}", "test_quick.py")
    assert result.ret == 0
    first = json.loads((pytester.path / report).read_text())
    assert first["complete"] is True and first["exitstatus"] == 0
    return first


# --- item 1: a killed run never leaves the previous run's report passing for its own ----------


def test_a_killed_run_leaves_its_own_incomplete_report_not_the_previous_one(
    pytester: pytest.Pytester,
) -> None:
    first = complete_first_run(pytester)
    pytester.makepyfile(test_blocks=BLOCKS)
    proc = pytester.popen(
        [sys.executable, "-m", "pytest", *ARGS, "--shutdown-report=r.json", "test_blocks.py"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    pid_file = pytester.path / "pid"
    deadline = time.monotonic() + 60
    try:
        while not pid_file.exists() or not pid_file.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the second run never reached its test")
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        assert pid == proc.pid  # the pytest process itself, no xdist
        os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    report = json.loads((pytester.path / "r.json").read_text())
    assert report != first
    assert report["complete"] is False and report["exitstatus"] is None
    assert "has not finished, or it was killed" in report["incomplete"]
    assert report["in_progress"]["pid"] == pid
    assert report["in_progress"]["record_log"] == str(record_log_path(pytester.path / "r.json"))
    assert report["summary"]["tests"] == 0


#: Run 2's conftest: the final report (not the in-progress mark) cannot be written.
FINAL_WRITE_FAILS = textwrap.dedent(
    """
    import errno
    import pytest_shutdown.plugin.report as report

    _write = report.write_report

    def write_report(document, path):
        if "in_progress" not in document:
            raise OSError(errno.ENOSPC, "No space left on device")
        _write(document, path)

    report.write_report = write_report
    """
)

#: Run 2's conftest: no report can be written at all, not even the in-progress mark.
EVERY_WRITE_FAILS = textwrap.dedent(
    """
    import errno
    import pytest_shutdown.plugin.report as report

    def write_report(document, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    report.write_report = write_report
    """
)


def second_run_with_conftest(pytester: pytest.Pytester, conftest: str) -> pytest.RunResult:
    """Run 2 after a complete run 1, with ``conftest``; it passes (exit status 0)."""
    complete_first_run(pytester)
    pytester.makeconftest(conftest)
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-report=r.json", "test_quick.py")
    assert result.ret == 0
    return result


def test_a_run_whose_final_report_cannot_be_written_leaves_it_in_progress(
    pytester: pytest.Pytester,
) -> None:
    result = second_run_with_conftest(pytester, FINAL_WRITE_FAILS)
    out = " ".join(result.stdout.str().split())
    assert "shutdown report not written to" in out and "ENOSPC" in out, out
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["complete"] is False and report["exitstatus"] is None
    assert "has not finished, or it was killed or could not write" in report["incomplete"]


def test_a_run_that_cannot_even_mark_the_report_removes_the_previous_one(
    pytester: pytest.Pytester,
) -> None:
    result = second_run_with_conftest(pytester, EVERY_WRITE_FAILS)
    assert "shutdown report not written to" in " ".join(result.stdout.str().split())
    assert not (pytester.path / "r.json").exists()


# --- item 4: a report path never takes a record log's name ------------------------------------


@pytest.mark.parametrize("name", ["r.records.jsonl", "R.Records.JSONL"])
def test_a_report_path_named_as_a_record_log_is_refused(
    pytester: pytest.Pytester, name: str
) -> None:
    # Another run's record log (the run whose --shutdown-report is r.json) is there.
    log = pytester.path / name
    log.write_text('{"type": "session", "pid": 1}\n')
    pytester.makepyfile(test_never_runs="def test_never_runs(): open('ran', 'w').close()")
    result = pytester.runpytest_subprocess(*ARGS, f"--shutdown-report={name}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "--shutdown-report" in err and "named as a record log is" in err, err
    assert log.read_text() == '{"type": "session", "pid": 1}\n'
    assert not (pytester.path / "ran").exists()


def test_the_assembler_refuses_a_record_log_name_as_its_output(tmp_path: Path) -> None:
    log = tmp_path / "r.records.jsonl"
    log.write_text('{"type": "session", "pid": 1}\n')
    with pytest.raises(SystemExit) as exit_info:
        main([str(log), "-o", str(log)])
    assert exit_info.value.code == 2
    assert log.read_text() == '{"type": "session", "pid": 1}\n'


# --- item 7: a name longer than the file system takes is a usage error ------------------------


@pytest.mark.parametrize(
    ("option", "make_value", "whose"),
    [
        ("--shutdown-report", lambda n: "x" * (n + 1) + ".json", "the name"),
        ("--shutdown-report", lambda n: "d" * (n + 1) + "/r.json", "the name"),
        # The report's name fits; its record log's (<stem>.records.jsonl) does not.
        ("--shutdown-report", lambda n: "x" * (n - 8) + ".json", "record log's name"),
        ("--shutdown-graphs", lambda n: "g" * (n + 1), "the name"),
    ],
)
def test_a_name_over_the_limit_is_a_usage_error_naming_the_option(
    pytester: pytest.Pytester, option: str, make_value: object, whose: str
) -> None:
    limit = name_max(pytester.path)
    pytester.makepyfile(test_never_runs="def test_never_runs(): open('ran', 'w').close()")
    value = make_value(limit)  # type: ignore[operator]
    result = pytester.runpytest_subprocess(*ARGS, f"{option}={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    err = result.stderr.str()
    assert "INTERNALERROR" not in err + result.stdout.str()
    assert option in err and whose in err and f"at most {limit} bytes" in err, err
    assert not (pytester.path / "ran").exists()


def test_the_longest_accepted_name_is_written(pytester: pytest.Pytester) -> None:
    # Its record log's name is exactly at the limit; the report's temporary file fits too.
    name = "x" * (name_max(pytester.path) - len(".records.jsonl")) + ".json"
    pytester.makepyfile(test_quick=QUICK)
    result = pytester.runpytest_subprocess(*ARGS, f"--shutdown-report={name}")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert json.loads((pytester.path / name).read_text())["complete"] is True
    assert [p.name for p in pytester.path.glob("*.tmp")] == []


# --- item 12: a refused run creates nothing ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--shutdown-report=new/deep/r.json", "--shutdown-long-lived=bogus"], "long-lived"),
        (["--shutdown-report=new/deep/r.json", "--shutdown-resources=bogus"], "resources"),
        (["--shutdown-report=new/deep/r.json", "--shutdown-graphs=a-file"], "graphs"),
        (["--shutdown-graphs=new/deep", "--shutdown-long-lived=bogus"], "long-lived"),
        (["--shutdown-graphs=new/deep", "--shutdown-report=a-file/r.json"], "report"),
    ],
)
def test_a_refused_run_creates_no_folder(
    pytester: pytest.Pytester, args: list[str], named: str
) -> None:
    (pytester.path / "a-file").write_text("not a folder")
    pytester.makepyfile(test_never_runs="def test_never_runs(): open('ran', 'w').close()")
    result = pytester.runpytest_subprocess(*ARGS, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--shutdown-{named}" in result.stderr.str()
    assert not (pytester.path / "new").exists()
    assert not (pytester.path / "ran").exists()


def test_a_folder_that_cannot_be_created_is_refused_without_creating_its_parents(
    pytester: pytest.Pytester,
) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes in a read-only folder")
    locked = pytester.path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        pytester.makepyfile(test_never_runs="def test_never_runs(): pass")
        result = pytester.runpytest_subprocess(*ARGS, "--shutdown-report=locked/new/r.json")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        err = result.stderr.str()
        assert "--shutdown-report: cannot create the folder" in err, err
        assert not (locked / "new").exists()
    finally:
        locked.chmod(0o700)


def test_the_report_folder_is_created_once_the_options_are_valid(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_quick=QUICK)
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-report=new/deep/r.json")
    assert result.ret == 0
    assert json.loads((pytester.path / "new/deep/r.json").read_text())["complete"] is True


def test_findings_at_session_end_are_not_counted_as_a_test(pytester: pytest.Pytester) -> None:
    """A process still running at session end made the summary say '2 of 1 test with
    findings': the ``<session end>`` record is named, not counted as a test. (Its grace runs
    out during the second test: confirmed then, and still running at session end.)"""
    pytester.makepyfile(
        test_late="""
        import subprocess, sys, time

        def test_leaks_a_short_process():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])

        def test_outlasts_the_grace():
            time.sleep(0.5)
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-guard=warn", "--shutdown-grace=0.1", timeout=60
    )
    heads = [line for line in result.outlines if "with findings" in line]
    assert heads, result.stdout.str()
    assert heads[0].startswith("1 of 2 tests with findings, and findings at <session end> ("), heads
