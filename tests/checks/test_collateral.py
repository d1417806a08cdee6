"""assert_no_collateral: a shutdown that kills what it does not own is caught; one that kills
only its own children passes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from pytest_shutdown import ShutdownContractError, assert_no_collateral
from pytest_shutdown.checks.leaks import multiprocessing_helper_pids

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


class Engine:
    """An engine with one worker process of its own."""

    def __init__(self) -> None:
        self.worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

    def shutdown(self) -> str:
        self.worker.kill()
        self.worker.wait(10)
        return "done"


class KillsEverything(Engine):
    """SGLang's shape: kill_process_tree(os.getpid(), include_parent=False)."""

    def shutdown(self) -> str:
        for child in psutil.Process(os.getpid()).children(recursive=True):
            try:
                child.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        self.worker.wait(10)
        return "done"


def test_a_shutdown_that_kills_only_its_own_passes_and_returns_its_result() -> None:
    engine = Engine()
    assert assert_no_collateral(engine.shutdown) == "done"
    assert engine.worker.returncode == -signal.SIGKILL


def test_a_shutdown_that_kills_every_child_of_its_process_is_collateral_kill() -> None:
    engine = KillsEverything()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ShutdownContractError) as caught:
        assert_no_collateral(engine.shutdown)
    (finding,) = caught.value.findings
    assert finding.code == "collateral-kill"
    victims = {v["sentinel"]: v for v in finding.details["victims"]}
    assert set(victims) == {"plain child", "multiprocessing child", "grandchild"}
    assert victims["plain child"]["how"] == "killed by SIGKILL"
    assert victims["multiprocessing child"]["how"] == "killed by SIGKILL"
    assert "SIGKILL" in victims["grandchild"]["how"]
    assert "KillsEverything.shutdown() killed processes it does not own" in finding.message
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after - multiprocessing_helper_pids() <= before  # every sentinel cleaned up


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
    with pytest.raises(TypeError, match="fn must be callable"):
        assert_no_collateral("engine.shutdown")  # type: ignore[arg-type]
