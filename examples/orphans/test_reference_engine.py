"""The orphan matrix on the reference engine: frontend, 2 EngineCores, 2 workers each.

Every level is killed with every signal in every phase; the whole tree must be gone within
10 s (it takes well under one). ``REFERENCE_LEVELS`` names the levels by process name,
``REFERENCE_PHASES`` waits for the whole tree before acting in ``starting``.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_shutdown import kill_tree_at
from pytest_shutdown.engine import REFERENCE_LEVELS, REFERENCE_PHASES, serve_frontend

#: The process each level's signal goes to.
VICTIMS = {"frontend": "Frontend", "engine_core": "EngineCore_DP0", "worker": "Worker_TP0"}


def root_exitcode(cell: Any) -> int | None:
    """How the frontend ends in ``cell`` (None: either way, the teardown was already under way)."""
    if cell.level == "frontend":
        if cell.signal == "SIGKILL":
            return -9
        return 1 if cell.phase == "starting" else 0  # an aborted start, or a graceful stop
    return None if cell.phase == "shutting_down" else 1  # an engine died: it stops everything


@pytest.mark.orphan_matrix(
    level=["frontend", "engine_core", "worker"],
    signal=["SIGKILL", "SIGTERM", "SIGINT"],
    phase=["starting", "ready", "busy", "shutting_down"],
)
def test_the_reference_tree_dies_whole(kill_tree: Any, orphan_cell: Any) -> None:
    record = kill_tree(serve_frontend, levels=REFERENCE_LEVELS, phases=REFERENCE_PHASES)
    # The whole tree was there when the signal came: the frontend, 2 EngineCores, 4 workers.
    assert record.processes_at_signal == 7
    assert record.victim_name == VICTIMS[orphan_cell.level]
    if root_exitcode(orphan_cell) is not None:
        assert record.root_exitcode == root_exitcode(orphan_cell)


def test_one_cell_in_plain_python() -> None:
    record = kill_tree_at(serve_frontend, level="worker", signal="SIGKILL", phase="busy",
                          levels=REFERENCE_LEVELS)
    assert record.died, record.findings
    assert record.victim_name == "Worker_TP0" and record.root_exitcode == 1
