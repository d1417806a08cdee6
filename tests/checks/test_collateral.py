"""assert_no_collateral: a shutdown that kills what it does not own is caught; one that kills
only its own children passes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from pytest_shutdown import assert_no_collateral
from pytest_shutdown.helpers.leaks import multiprocessing_helper_pids

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


class Engine:
    """An engine with one worker process of its own."""

    def __init__(self) -> None:
        self.worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

    def shutdown(self) -> str:
        self.worker.kill()
        self.worker.wait(10)
        return "done"


def test_a_shutdown_that_kills_only_its_own_passes_and_returns_its_result() -> None:
    engine = Engine()
    assert assert_no_collateral(engine.shutdown) == "done"
    assert engine.worker.returncode == -signal.SIGKILL


# Killing every child of the pytest worker would kill its fork server and resource tracker too
# (later tests in the worker then fail with ChildProcessError), so the killer runs in a child
# interpreter of its own and reports what the helper found.
KILLER = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys
    import psutil
    from pytest_shutdown import ShutdownContractError, assert_no_collateral

    class KillsEverything:
        # SGLang's shape: kill_process_tree(os.getpid(), include_parent=False)
        def __init__(self):
            self.worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

        def shutdown(self):
            for child in psutil.Process(os.getpid()).children(recursive=True):
                try:
                    child.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass
            self.worker.wait(10)

    try:
        assert_no_collateral(KillsEverything().shutdown)
    except ShutdownContractError as error:
        (finding,) = error.findings
        print(json.dumps({"code": finding.code, "message": finding.message,
                          "victims": finding.details["victims"]}))
    """
)


def test_a_shutdown_that_kills_every_child_of_its_process_is_collateral_kill() -> None:
    run = subprocess.run(
        [sys.executable, "-c", KILLER], capture_output=True, text=True, timeout=120, check=True
    )
    found = json.loads(run.stdout)
    assert found["code"] == "collateral-kill"
    victims = {v["sentinel"]: v for v in found["victims"]}
    assert set(victims) == {"plain child", "multiprocessing child", "grandchild"}
    assert victims["plain child"]["how"] == "killed by SIGKILL"
    assert victims["multiprocessing child"]["how"] == "killed by SIGKILL"
    assert "SIGKILL" in victims["grandchild"]["how"]
    assert "KillsEverything.shutdown() killed processes it does not own" in found["message"]


def test_arguments_are_passed_and_an_exception_propagates_after_cleanup() -> None:
    seen = []

    def shutdown(a: int, *, b: int) -> None:
        seen.append((a, b))
        raise RuntimeError("boom")

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(RuntimeError, match="boom"):
        assert_no_collateral(shutdown, 1, b=2)
    assert seen == [(1, 2)]
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after - multiprocessing_helper_pids() <= before  # the spawn resource tracker stays


def test_fn_must_be_callable() -> None:
    with pytest.raises(TypeError, match="`fn` is 'engine.shutdown' \\(a str\\), not callable"):
        assert_no_collateral("engine.shutdown")  # type: ignore[arg-type]
