"""Runs inside a test: a script in a fresh interpreter; inner pytest runs, with pieces of the
suites they run, and runs in a subprocess that a test starts, waits on and ends itself (a signal
in the middle of a run, a run that must not hang): start one, wait until it reached a point,
collect its exit status and output, read its report."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

#: The plugin, in a run whose tests keep their order and that leaves no cache behind.
ARGS = ("-p", "shutdown", "-p", "no:randomly", "-p", "no:cacheprovider", "--shutdown-grace=0.2")


def fresh_python(script: str, *args: str, timeout: float = 60) -> str:
    """Run ``script`` in a fresh interpreter; its stdout, once it exited 0."""
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


#: An inner suite's ``server`` fixture: a process sleeping 60 s, started by the fixture and
#: stopped by its teardown (``proc.terminate()`` or ``proc.kill()``, then a wait).
SERVER_FIXTURE = textwrap.dedent(
    """
    import subprocess, sys
    import pytest

    SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]

    @pytest.fixture(scope="{scope}")
    def server():
        proc = subprocess.Popen(SLEEP)
        yield proc
        proc.{stop}()
        proc.wait(10)
    """
)


#: An inner suite's start: ``test_a_leaks_a_thread`` leaves a thread 'leaky' running (a
#: thread-leak finding); ``threading`` and ``pytest`` imported.
A_LEAKS_A_THREAD = textwrap.dedent(
    """
    import threading
    import pytest

    _release = threading.Event()

    def test_a_leaks_a_thread():
        threading.Thread(target=_release.wait, name="leaky", daemon=True).start()
    """
)


#: An inner suite's class whose second ``shutdown()`` raises ``RuntimeError("closed twice")``.
RAISES_WHEN_REPEATED = """
class RaisesWhenRepeated:
    def __init__(self):
        self.calls = 0

    def shutdown(self):
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("closed twice")
"""


#: An inner suite's start: ``Leaky``, whose finalizer is its own bound method (so it is never
#: collected: ``assert_finalizes_on_gc(Leaky)`` fails); ``pytest``, ``ShutdownContractError``
#: and ``assert_finalizes_on_gc`` imported.
LEAKY_FINALIZER = """
import weakref
import pytest
from pytest_shutdown import ShutdownContractError, assert_finalizes_on_gc

class Leaky:
    def __init__(self):
        self._finalizer = weakref.finalize(self, self.shutdown)
    def shutdown(self):
        pass
"""


def server_fixture(scope: str, stop: str) -> str:
    """The source of :data:`SERVER_FIXTURE` for ``scope``, stopping with ``proc.<stop>()``."""
    return SERVER_FIXTURE.format(scope=scope, stop=stop)


def write_marked_test(pytester: pytest.Pytester, marker: str, signature: str) -> None:
    """A test file of one test, ``def <signature>: pass``, marked ``@pytest.mark.<marker>``."""
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.{marker}
        def {signature}:
            pass
        """
    )


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


def start_reported_run(
    pytester: pytest.Pytester, reached: str, what: str
) -> subprocess.Popen[bytes]:
    """A run with :data:`ARGS` and a report in r.json, once it wrote the file ``reached`` (at
    ``what``)."""
    proc = popen_pytest(pytester, *ARGS, "--shutdown-report=r.json")
    wait_for(pytester.path / reached, proc, what)
    return proc


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


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    """test id -> PASSED/FAILED/ERROR (an error at teardown after a pass counts as ERROR)."""
    found: dict[str, str] = {}
    for line in result.outlines:
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR") and "::" in rest:
            nodeid = rest.split(" - ")[0].strip()
            if found.get(nodeid) != "ERROR":
                found[nodeid] = word
    return found


def run_modes(
    pytester: pytest.Pytester, *args: str, guarded: tuple[str, ...] = ()
) -> dict[str, dict[str, str]]:
    """Per-test outcomes plain, warn and fail (the do-no-harm checks: warn must give plain's
    outcome on every test, fail adds errors only on tests that leak); ``guarded``: options of
    the guarded runs only. Each run has a deadline: a hang at exit fails the test."""
    common = ("-p", "no:randomly", "-p", "no:cacheprovider", "-rA", *args)

    def run(*mode: str) -> dict[str, str]:
        return outcomes(pytester.runpytest_subprocess(*mode, *common, timeout=90))

    return {
        "plain": run("-p", "no:shutdown"),
        "warn": run("-p", "shutdown", "--shutdown-guard=warn", *guarded),
        "fail": run("-p", "shutdown", "--shutdown-guard=fail", *guarded),
    }
