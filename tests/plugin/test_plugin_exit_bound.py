"""A non-daemon thread a test leaked never hangs the exit in fail mode; the report is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

SUITE = textwrap.dedent(
    """
    import atexit, threading

    NEVER = threading.Event()

    def test_leaks_a_non_daemon_thread():
        threading.Thread(target=NEVER.wait, name="never-ends").start()

    def test_after():
        atexit.register(lambda: open("atexit-ran", "w").close())  # other exit work still runs
    """
)


def _command(tmp_path: Path, mode: str) -> tuple[list[str], dict[str, str]]:
    (tmp_path / "test_exit.py").write_text(SUITE)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "shutdown",
        f"--shutdown-guard={mode}",
        "--shutdown-grace=0.5",
        "--shutdown-report=report.json",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
    ]
    return command, env


def _run(tmp_path: Path, mode: str, timeout: float) -> subprocess.CompletedProcess[str]:
    command, env = _command(tmp_path, mode)
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_fail_mode_exits_within_a_bound_with_the_report_written(tmp_path: Path) -> None:
    start = time.monotonic()
    result = _run(tmp_path, "fail", timeout=120)  # would hang forever without the bound
    took = time.monotonic() - start
    assert result.returncode == 1, result.stdout + result.stderr
    assert "(non-daemon: it blocks the interpreter's exit)" in result.stdout
    said = (
        "1 non-daemon thread started by the session's tests still running at session end: "
        "'never-ends'; the exit waits at most the 0.5 s grace for them instead of hanging."
    )
    assert said in result.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    codes = [f["code"] for r in report["tests"] for f in r["findings"]]
    assert codes.count("thread-leak") == 2, report  # the test's, and the session end's
    assert (tmp_path / "atexit-ran").exists()  # the exit went on as usual: atexit ran
    print(f"exit took {took:.1f} s")  # a figure, not a timed assertion


def test_warn_mode_says_the_exit_will_wait(tmp_path: Path) -> None:
    command, env = _command(tmp_path, "warn")
    said = "the interpreter's exit will wait for them (forever if they never end)."
    seen: list[str] = []
    with subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as run:
        try:
            reader = threading.Thread(target=lambda: seen.extend(run.stdout or ()), daemon=True)
            reader.start()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(said in line for line in seen):
                assert run.poll() is None, "".join(seen)  # warn mode never cuts the exit short
                time.sleep(0.05)
            assert any(said in line for line in seen), "".join(seen)
            time.sleep(2.0)  # well past the 0.5 s grace: still waiting, as without the plugin
            assert run.poll() is None, "".join(seen)
        finally:
            run.kill()
            run.wait(10)
