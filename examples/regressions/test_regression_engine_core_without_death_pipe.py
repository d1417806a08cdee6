"""vLLM issue #55510: the API server is SIGKILLed and its EngineCores survive, holding the GPUs.

A supervisor's forced stop or the OOM killer SIGKILLs the API server: it runs no cleanup. The
EngineCores had no way to notice (no death pipe), so they and their TP workers lived on,
re-parented, with their device memory. Fixed (vLLM PR #55846) by a death pipe per engine: the
reference EngineCore watches its parent (pipe EOF, pid watch, PDEATHSIG) at every phase.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError
from pytest_shutdown.engine import REFERENCE_LEVELS, ChildFaults, serve_frontend

#: The buggy tree waits all of it (generous: the fixed parts must be gone by then).
DEADLINE_S = 5.0
CELL = {"level": "frontend", "signal": "SIGKILL", "phase": "ready"}


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert set(error.codes) == {code}, error.codes
    names = {f.details["name"] for f in error.findings}
    assert names == {"EngineCore_DP0", "EngineCore_DP1", "Worker_TP0", "Worker_TP1"}, names
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="EngineCores outlive it")
def test_engine_cores_without_a_death_pipe_outlive_a_killed_frontend(kill_tree: Any) -> None:
    try:
        kill_tree(serve_frontend, kwargs={"faults": ChildFaults(engine_lifeline=False)},
                  levels=REFERENCE_LEVELS, deadline_s=DEADLINE_S, **CELL)
    except ShutdownContractError as error:
        expect("orphan-process", error)


def test_engine_cores_with_a_death_pipe_die_with_a_killed_frontend(kill_tree: Any) -> None:
    kill_tree(serve_frontend, levels=REFERENCE_LEVELS, **CELL)
