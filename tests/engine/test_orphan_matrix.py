"""The orphan matrix on the reference engine: tp=2, dp=2, every level x signal x phase.

Each cell starts the whole tree (frontend, two EngineCores, two workers each) through the
session's tree launcher, kills one level with one signal in one phase, and fails with
orphan-process / exit-hang if any process of the tree is still running 10 s later. A correct
tree is gone in well under a second; the whole matrix runs in about half a minute here.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_shutdown.engine.frontend import REFERENCE_LEVELS, REFERENCE_PHASES, serve_frontend


@pytest.mark.orphan_matrix(
    level=["frontend", "engine_core", "worker"],
    signal=["SIGKILL", "SIGTERM", "SIGINT"],
    phase=["starting", "ready", "busy", "shutting_down"],
)
def test_every_level_dies_with_its_parent_at_any_phase(
    kill_tree: Any, orphan_cell: Any
) -> None:
    record = kill_tree(serve_frontend, levels=REFERENCE_LEVELS, phases=REFERENCE_PHASES)
    assert record.died
    expected_victim = {"frontend": "Frontend", "engine_core": "EngineCore_DP0",
                       "worker": "Worker_TP0"}[orphan_cell.level]
    assert record.victim_name == expected_victim
    # The whole tree existed when the signal came: the frontend, 2 EngineCores, 4 workers.
    assert record.processes_at_signal == 7
    if orphan_cell.level == "frontend" and orphan_cell.signal == "SIGKILL":
        assert record.root_exitcode == -9
    elif orphan_cell.level == "frontend" and orphan_cell.phase != "starting":
        assert record.root_exitcode == 0  # a graceful stop
    elif orphan_cell.phase != "shutting_down":
        assert record.root_exitcode == 1  # an engine died: the frontend stops everything
