"""Inner pytest runs in a subprocess that a test starts, waits on and ends itself (a signal in the
middle of a run, a run that must not hang): start one, wait until it reached a point, collect
its exit status and output, read its report."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: The plugin, in a run whose tests keep their order and that leaves no cache behind.
ARGS = ("-p", "shutdown", "-p", "no:randomly", "-p", "no:cacheprovider", "--shutdown-grace=0.2")


def popen_pytest(
    pytester: pytest.Pytester, *args: str, **kwargs: object
) -> subprocess.Popen[bytes]:
    """``python -m pytest *args`` in the pytester folder, stdout and stderr as one pipe."""
    return pytester.popen(
        [sys.executable, "-m", "pytest", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        **kwargs,  # type: ignore[arg-type]
    )


def wait_for(path: Path, proc: subprocess.Popen[bytes], what: str) -> None:
    """Until the inner run wrote ``path``; fail with its output if it ended first or took 60 s."""
    deadline = time.monotonic() + 60
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out = proc.communicate(timeout=30)[0].decode(errors="replace")
            pytest.fail(f"the inner run never reached {what}:\n{out}")
        time.sleep(0.05)


def finish(proc: subprocess.Popen[bytes], timeout: float = 60) -> tuple[int, str]:
    """The inner run's exit status and output; fail (after killing it) if it did not end."""
    try:
        out = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        out = proc.communicate(timeout=30)[0]
        pytest.fail(f"the inner run did not end:\n{out.decode(errors='replace')}")
    return proc.returncode, out.decode(errors="replace")


def load_report(pytester: pytest.Pytester, name: str = "r.json") -> dict:
    """The JSON report the inner run wrote (``--shutdown-report=r.json``)."""
    return json.loads((pytester.path / name).read_text())
