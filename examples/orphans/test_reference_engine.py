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


@pytest.mark.orphan_matrix(
    level=["frontend", "engine_core", "worker"],
    signal=["SIGKILL", "SIGTERM", "SIGINT"],
    phase=["starting", "ready", "busy", "shutting_down"],
)
def test_the_reference_tree_dies_whole(kill_tree: Any) -> None:
    kill_tree(serve_frontend, levels=REFERENCE_LEVELS, phases=REFERENCE_PHASES)


def test_one_cell_in_plain_python() -> None:
    record = kill_tree_at(serve_frontend, level="worker", signal="SIGKILL", phase="busy",
                          levels=REFERENCE_LEVELS)
    assert record.died, record.findings
    assert record.victim_name == "Worker_TP0" and record.root_exitcode == 1
