"""Session-end check: no test under tests/engine left a process behind."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from engine_proc_testing import descendants

from pytest_shutdown.engine.processes import EngineProcManager, kill_process_tree

#: Processes still exiting at the end of the session get this long before they count as left.
LEFTOVER_GRACE_S = 5.0


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Fail the session's last teardown if any test left a child process running.

    The process's own fork server and resource tracker are helpers that end with it, and do not
    count. Leftovers are killed (whole trees) after they are reported, so they never outlive the
    session either.
    """
    yield
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    left = descendants()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = descendants()
    if not left:
        return
    described = []
    for proc in left:
        try:
            described.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}")
        except psutil.Error:
            described.append(f"pid {proc.pid}")
        kill_process_tree(proc.pid)
    pytest.fail("processes left behind by the engine tests:\n" + "\n".join(described))


@pytest.fixture
def log(tmp_path: Path) -> str:
    """A lifecycle-log path for engine children (one JSON line per event)."""
    return str(tmp_path / "lifecycle.jsonl")


@pytest.fixture
def managers() -> Iterator[list[EngineProcManager]]:
    """Managers a test appends to are shut down (timeout 0) at its end, whatever happened."""
    made: list[EngineProcManager] = []
    yield made
    for manager in made:
        manager.shutdown(0)
