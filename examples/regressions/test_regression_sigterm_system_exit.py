"""vllm-omni PR #3001: a stage turns SIGTERM into SystemExit, and its TP workers outlive it.

The middle level (a stage; here an EngineCore) raised SystemExit from its SIGTERM handler. The
exception skipped the graceful path, the only place its workers were stopped, and the workers
had no death pipe of their own. Fixed: the handler only sets state (the busy loop shuts down,
the ``finally`` stops the workers), and every worker dies with its parent anyway.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError
from pytest_shutdown.engine import REFERENCE_LEVELS, ChildFaults, serve_frontend

DEADLINE_S = 5.0
CELL = {"level": "engine_core", "signal": "SIGTERM", "phase": "ready"}
BUG = ChildFaults(sigterm_raises_system_exit=True, worker_lifeline=False)


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert set(error.codes) == {code}, error.codes
    orphans = [f.details for f in error.findings]
    assert {d["name"] for d in orphans} == {"Worker_TP0", "Worker_TP1"}, orphans
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="its workers outlive it")
def test_sigterm_as_system_exit_orphans_the_stages_workers(kill_tree: Any) -> None:
    try:
        kill_tree(serve_frontend, kwargs={"faults": BUG}, levels=REFERENCE_LEVELS,
                  deadline_s=DEADLINE_S, **CELL)
    except ShutdownContractError as error:
        expect("orphan-process", error)


def test_a_sigterm_that_only_sets_state_stops_the_stages_workers(kill_tree: Any) -> None:
    kill_tree(serve_frontend, levels=REFERENCE_LEVELS, **CELL)
