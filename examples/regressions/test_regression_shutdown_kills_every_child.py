"""A shutdown that kills every child of its process: SGLang's ``Engine.shutdown()`` ends with
``kill_process_tree(os.getpid(), include_parent=False)``, SIGKILLing a session fixture's server,
a pool, another engine (TensorRT-LLM #16404 killed the whole pytest session this way). Fixed:
the engine kills the trees of the processes it started, and nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from multiprocessing import resource_tracker

import psutil
import pytest

from pytest_shutdown import ShutdownContractError, assert_no_collateral
from pytest_shutdown.orphans import kill_process_trees

WORKER = "import time\nfor _ in range(600): time.sleep(0.1)"

# The example's bug must not take down the rest of the demo session: the buggy engine below
# kills only processes younger than itself, so the spawn helper is started before any engine.
resource_tracker.ensure_running()


class BuggyEngine:
    def __init__(self) -> None:
        self.older = {p.pid for p in psutil.Process().children(recursive=True)}
        self.scheduler = subprocess.Popen([sys.executable, "-c", WORKER])

    def shutdown(self) -> None:
        # kill_process_tree(os.getpid(), include_parent=False); here limited to processes
        # younger than the engine, so that the demo session's other fixtures survive it
        for child in psutil.Process(os.getpid()).children(recursive=True):
            try:
                if child.pid not in self.older:
                    child.kill()
            except psutil.Error:
                pass
        self.scheduler.wait(10)


class FixedEngine:
    def __init__(self) -> None:
        self.scheduler = subprocess.Popen([sys.executable, "-c", WORKER])

    def shutdown(self) -> None:
        kill_process_trees([self.scheduler.pid])  # its own tree only
        self.scheduler.wait(10)


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="kills what it does not own")
def test_buggy_shutdown_kills_every_child_of_its_process() -> None:
    try:
        assert_no_collateral(BuggyEngine().shutdown)
    except ShutdownContractError as error:
        assert error.codes == ["collateral-kill"], error.codes
        raise


def test_fixed_shutdown_kills_only_its_own_tree() -> None:
    assert_no_collateral(FixedEngine().shutdown)
