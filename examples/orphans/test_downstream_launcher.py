"""The orphan matrix on a downstream launcher: a command line, its own levels, its own phases.

``downstream_launcher.py`` knows nothing of pytest-shutdown but the phase line it prints; the
levels are the launcher itself and a worker, told apart by their command lines.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError
from pytest_shutdown.orphans import TreeProcess

LAUNCHER = [sys.executable, str(Path(__file__).with_name("downstream_launcher.py")),
            "--workers", "2"]


def is_worker(process: TreeProcess, root_pid: int) -> bool:
    return "--worker" in process.cmdline()


@pytest.mark.orphan_matrix(level=["launcher", "worker"], signal=["SIGKILL", "SIGTERM", "SIGINT"])
def test_the_launcher_leaves_no_worker_behind(kill_tree: Any) -> None:
    kill_tree(LAUNCHER, levels={"launcher": "root", "worker": is_worker})


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="workers outlive it")
def test_workers_without_a_death_pipe_outlive_a_killed_launcher(kill_tree: Any) -> None:
    try:
        kill_tree([*LAUNCHER, "--without-death-pipe"], level="root", signal="SIGKILL",
                  phase="ready", deadline_s=2.0)
    except ShutdownContractError as error:
        assert error.codes == ["orphan-process", "orphan-process"], error.codes
        raise
